//! Verifies the sample cap lease N times: a fixed workload for counting
//! the instructions of one command check (`Frame::verify`) with an
//! instruction counter, as `docs/benchmarks.md` does to estimate its cost on
//! a Cortex-M4.
//!
//! ```sh
//! cargo run --release -p loopwarden-protocol --example verify_count -- 101
//! ```
//!
//! Everything but the loop (building the signed sample, deriving the public
//! key) is the same for every N, so the instructions of one verification are
//! (I(101) − I(1)) / 100, with I(N) the total a counter such as
//! `valgrind --tool=callgrind` reports for a run with N. To count the
//! 32-bit field arithmetic a Cortex-M4 runs (radix 2^25.5, 32 × 32 → 64-bit
//! multiplies) rather than the 64-bit one of x86_64 hosts, build it with
//! `RUSTFLAGS='--cfg curve25519_dalek_bits="32"'` into a separate target
//! directory (`CARGO_TARGET_DIR=/tmp/...`), so that the workspace's build is
//! not redone with other flags. It prints how many verifications passed.

use std::hint::black_box;

use loopwarden_protocol::{samples, MessageKind};

fn main() {
    let n: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 1,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("usage: verify_count [N]  (N: how many verifications; {e})");
            std::process::exit(2);
        }
    };
    let frame = samples::frame(MessageKind::CapLease);
    let to = samples::command_topic();
    let key = samples::demo_signing_key().verifying_key();
    let mut passed = 0u32;
    for _ in 0..n {
        if black_box(&frame)
            .verify(black_box(&to), |_, _| Some(black_box(&key)))
            .is_ok()
        {
            passed += 1;
        }
    }
    println!("{passed} of {n} verifications passed");
    if passed != n {
        std::process::exit(1);
    }
}
