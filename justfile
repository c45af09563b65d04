# agent-mesh task runner. CI runs `.ci/run`, which runs the same commands as
# `just ci`; `just check` adds the dependency policy check.
# Install the tools once with `just tools` (cargo-deny, cargo-fuzz).

set shell := ["bash", "-euo", "pipefail", "-c"]

# Everything a change must pass: format, lints, tests, dependency policy.
check: fmt clippy test deny

# What CI runs (no network tools needed beyond crates.io).
ci: fmt clippy doc test

fmt:
    cargo fmt --all -- --check

clippy:
    cargo clippy --workspace --all-targets -- -D warnings

# The API docs, with no warning (a broken link fails).
doc:
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# The whole test suite: unit, property, corpus replay, crash-consistency,
# simulator seeds and real iroh/redb tests.
test:
    cargo test --workspace

# Licenses, duplicate-version bans and sources (advisories need the network and stay out).
deny:
    cargo deny check bans licenses sources

# Criterion micro-benchmarks; figures go in docs/benchmarks.md.
bench:
    cargo bench -p mesh-protocol -p mesh-store

# NATS JetStream (the pinned harness in ../shared/peers/nats, or
# NATS_HARNESS=DIR) and `mesh bench local`, alternately, ROUNDS times; prints
# mesh's figures beside NATS's with the ratios and the hot-path goals.
compare-nats ROUNDS="2":
    cargo build --release -p mesh
    python3 scripts/compare-nats --rounds {{ROUNDS}}

# Run every fuzz target for SECONDS each (needs nightly and cargo-fuzz).
# New finds go to a scratch dir, so the committed corpus only grows by hand
# (see fuzz/README.md for the merge step).
fuzz SECONDS="60":
    cd fuzz && for t in $(cargo +nightly fuzz list); do mkdir -p "/tmp/mesh-fuzz/$t"; cargo +nightly fuzz run "$t" "/tmp/mesh-fuzz/$t" "corpus/$t" -- -max_total_time={{SECONDS}}; done

# A long chaos run of real daemons: faults for SECONDS, then the checker
# (docs/reliability.md). SEED replays a run; empty picks one (printed).
# Files go to target/chaos/long-<seed>/.
chaos SECONDS="1800" SEED="":
    CHAOS_SECONDS={{SECONDS}} CHAOS_SEED={{SEED}} cargo test -p mesh --test chaos -- --ignored --nocapture a_long_chaos_run_loses_nothing

# The retention run: SENDS messages of 1 KiB through daemons whose journals
# are bounded at 64 MiB; checks each mesh.redb stays within the bound plus
# its documented slack (docs/reliability.md, "Retention").
retention SENDS="1000000":
    RETENTION_SENDS={{SENDS}} cargo test -p mesh-daemon --test durable -- --ignored --nocapture a_million_sends

# Rerun one simulator seed, e.g. `just sim-seed 1234`.
sim-seed SEED:
    SIM_SEED={{SEED}} cargo test -p mesh-bus --test sim -- --nocapture

tools:
    cargo install --locked cargo-deny cargo-fuzz
