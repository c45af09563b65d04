//! Multi-node and multi-process tests of agent-mesh, and their shared helpers.
