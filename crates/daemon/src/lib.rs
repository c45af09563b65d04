//! The agent-mesh daemon: configuration, service wiring, local API and CLI.
