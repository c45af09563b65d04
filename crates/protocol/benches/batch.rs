//! Micro-benchmarks of the per-envelope costs: signing and verifying batches,
//! hashing a payload, and the frame codec. Throughput is in envelopes.
//!
//! `cargo bench -p mesh-protocol`; figures go in `docs/benchmarks.md`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use mesh_protocol::{
    Channel, Cid, Epoch, FRAME_HEADER_BYTES, Frame, NewEnvelope, OpenBatch, Payloads, SecretKey,
    decode_frame, encode_frame,
};

const PAYLOAD_BYTES: usize = 1024;
const SIZES: [usize; 3] = [1, 16, 256];

fn envelopes(n: usize) -> Vec<NewEnvelope> {
    (0..n)
        .map(|i| NewEnvelope {
            lamport: i as u64 + 1,
            created_ms: 1_767_225_600_000 + i as u64,
            kind: 0,
            payload: vec![(i % 251) as u8; PAYLOAD_BYTES],
        })
        .collect()
}

fn secret() -> SecretKey {
    SecretKey::from_bytes(&[1; 32])
}

fn channel() -> Channel {
    Channel::Direct(SecretKey::from_bytes(&[2; 32]).public())
}

fn sign(n: usize) -> OpenBatch {
    match OpenBatch::sign(&secret(), Epoch([7; 16]), channel(), 1, envelopes(n)) {
        Ok(b) => b,
        Err(e) => panic!("a batch of {n} is within the limits: {e}"),
    }
}

fn bench_sign(c: &mut Criterion) {
    let mut g = c.benchmark_group("sign");
    for n in SIZES {
        g.throughput(Throughput::Elements(n as u64));
        // Hash every payload and sign the header: what an author does per batch.
        g.bench_function(format!("{n}x1KiB"), |b| {
            let secret = secret();
            b.iter_batched(
                || envelopes(n),
                |envs| OpenBatch::sign(&secret, Epoch([7; 16]), channel(), 1, black_box(envs)),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_verify(c: &mut Criterion) {
    let mut g = c.benchmark_group("verify");
    for n in SIZES {
        g.throughput(Throughput::Elements(n as u64));
        let (batch, payloads) = sign(n).into_parts();
        let signed = batch.into_signed();
        // Check the signature and every payload's hash: what a receiver does per batch.
        g.bench_function(format!("{n}x1KiB"), |b| {
            b.iter_batched(
                || (signed.clone(), payloads.clone()),
                |(s, p)| s.verify().and_then(|v| v.open(p)),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_blake3(c: &mut Criterion) {
    let mut g = c.benchmark_group("blake3");
    g.throughput(Throughput::Elements(1));
    let payload = vec![0x5a; PAYLOAD_BYTES];
    g.bench_function("1KiB", |b| b.iter(|| Cid::of(black_box(&payload))));
    g.finish();
}

fn bench_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    let n = 256;
    g.throughput(Throughput::Elements(n as u64));
    let (batch, payloads) = sign(n).into_parts();
    let frame = Frame::Batch {
        batch: batch.into_signed(),
        payloads: Payloads(payloads),
    };
    let mut encoded = Vec::new();
    if let Err(e) = encode_frame(&frame, &mut encoded) {
        panic!("a full batch fits a frame: {e}");
    }
    g.bench_function("encode_frame/256x1KiB", |b| {
        let mut out = Vec::with_capacity(encoded.len());
        b.iter(|| {
            out.clear();
            encode_frame(black_box(&frame), &mut out)
        })
    });
    g.bench_function("decode_frame/256x1KiB", |b| {
        b.iter(|| decode_frame(black_box(&encoded[FRAME_HEADER_BYTES..])))
    });
    g.finish();
}

fn config() -> Criterion {
    // Short runs: the machines are shared and noisy; report medians.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_sign, bench_verify, bench_blake3, bench_codec
}
criterion_main!(benches);
