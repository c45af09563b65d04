//! Group-commit throughput of the store writer (filled in with the writer actor).

fn main() {}
