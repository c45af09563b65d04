//! The iroh transport: endpoint, connections, frame IO.
