//! The sans-IO core: `handle(input, now) -> effects`.
