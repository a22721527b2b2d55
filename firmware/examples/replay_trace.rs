//! Replays a trace captured from the firmware's debug port (UART3: the
//! link's frames of `loopwarden_link::trace::Trace`) through this
//! machine's decision path, built as the firmware builds its own (the
//! default core configuration, the register map's limits), and says
//! whether every digest matched:
//!
//! ```text
//! cargo run --target x86_64-unknown-linux-gnu --features host \
//!   --example replay_trace -- target/firmware/run/trace.bin
//! ```
//!
//! Its last line is a JSON object (`frames`, `frames_dropped`,
//! `frames_lost`, `boots`, `inputs`, `digests_compared`,
//! `digests_matched`, `first_mismatch`, `steps`, `insn_max`,
//! `stack_peak_bytes`, `digest_matches`); it exits 0 when every digest
//! matched and no frame was lost, 1 when not, 2 when the file cannot be
//! read.
//!
//! Glossary:
//! - *dropped*: a frame that failed its checks; *lost*: a gap in the
//!   frame numbers.

use std::process::ExitCode;

use cooling_core::CoreConfig;
use loopwarden_firmware::cdu::map_limits;
use loopwarden_link::frame::max_frame;
use loopwarden_link::trace::{Replayer, Trace};
use loopwarden_link::{Deframer, Fed, SeqWatch, MAX_MESSAGE};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: replay_trace FILE (a capture of the firmware's UART3)");
        return ExitCode::from(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("replay_trace: cannot read {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut r = match Replayer::new(CoreConfig::default(), map_limits()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replay_trace: the decision path's configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let mut d = Box::new(Deframer::<{ max_frame(MAX_MESSAGE) }>::default());
    let mut seq = SeqWatch::default();
    let (mut frames, mut dropped, mut steps, mut insn_max, mut stack) = (0u64, 0u64, 0u64, 0, 0);
    for b in bytes {
        match d.push(b) {
            Fed::More => {}
            Fed::Dropped(e) => {
                dropped += 1;
                eprintln!("replay_trace: {e}");
            }
            Fed::Frame(f) => {
                frames += 1;
                // A restart numbers its frames from 0 again: no loss.
                seq.hear(f.seq);
                let Ok(t) = f.message::<Trace>() else {
                    dropped += 1;
                    eprintln!("replay_trace: frame {}: not a trace record", f.seq);
                    continue;
                };
                if let Some((_, cost)) = r.hear(&t) {
                    steps += 1;
                    insn_max = insn_max.max(cost.insn_max);
                    stack = stack.max(cost.stack_peak);
                }
            }
        }
    }
    let ok = r.all_match() && seq.lost == 0 && dropped == 0;
    say(
        &r,
        (frames, dropped, seq.lost),
        (steps, insn_max, stack),
        ok,
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The replay's figures as one JSON line: `(frames, dropped, lost)` and
/// `(steps, insn_max, stack_peak)` besides the replayer's counts.
fn say(r: &Replayer, (frames, dropped, lost): (u64, u64, u64), cost: (u64, u32, u32), ok: bool) {
    let (steps, insn_max, stack) = cost;
    let mismatch = match r.first_mismatch {
        Some(m) => format!(
            "{{\"input\": {}, \"firmware\": {}, \"here\": {}}}",
            m.input, m.theirs, m.ours
        ),
        None => "null".into(),
    };
    println!(
        "{{\"frames\": {frames}, \"frames_dropped\": {dropped}, \"frames_lost\": {}, \"boots\": {}, \
         \"inputs\": {}, \"digests_compared\": {}, \"digests_matched\": {}, \"first_mismatch\": {mismatch}, \
         \"steps\": {steps}, \"insn_max\": {insn_max}, \"stack_peak_bytes\": {stack}, \"digest_matches\": {ok}}}",
        lost, r.boots, r.inputs, r.compared, r.matched
    );
}
