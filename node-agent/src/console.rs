//! The field engineer's console: `node-agent ctl …` against the running
//! agent over a local Unix socket.
//!
//! One request per connection: a line of JSON (`{"cmd":"gpus"}`), answered
//! by a line of JSON. `node-agent ctl` prints it as aligned tables, or
//! as-is with `--json` for scripts. The socket is created with mode 0660:
//! whoever may read it may see the host's state; nothing on it changes
//! anything. Answers come from what the loop published after its last step
//! ([`Snapshot`]) and from the event log; the loop is never asked.
//!
//! - [`snapshot`]: what the console answers from;
//! - `answer`: the requests answered as JSON, on the agent's side;
//! - `render`: the answers as tables, on the client's side;
//! - `serial`: the same requests on the host's serial port
//!   (`console_serial`, [`start_serial`]), read-only too.
//!
//! Glossary:
//! - *request*: `status`, `gpus`, `caps`, `events` (with `since`, ms since
//!   the epoch) or `why` (with `gpu`).

use std::path::Path;

use loopwarden_field as field;
use loopwarden_field::console::Peer;
pub use loopwarden_field::time::parse_since;
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;

mod answer;
mod render;
mod serial;
pub mod snapshot;

pub use answer::answer;
pub use render::render;
pub use serial::SerialHost;
pub use snapshot::{
    snapshot_channel, ActionFailure, ActionKind, Context, GpuView, ResendCounts, SiteActions,
    Snapshot, Timing,
};

/// The agent, as `node-agent ctl` names it in its messages.
pub const PEER: Peer<'static> = Peer {
    who: "agent",
    program: "node-agent",
    default_socket: crate::config::default_console,
};

/// A console request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The agent at a glance.
    Status,
    /// Every GPU's last sample.
    Gpus,
    /// Limits in force and the leases behind them.
    Caps,
    /// The event log from flash.
    Events {
        /// Only events at or after this time (ms since the epoch).
        #[serde(default)]
        since: Option<u64>,
    },
    /// Everything the agent knows about one GPU's state.
    Why {
        /// The GPU.
        gpu: u8,
    },
}

/// Binds the console socket, replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    field::console::bind(path, "agent")
}

/// Answers connections until the task is dropped, within `limits`
/// (counted in the context's `console_stats`).
pub async fn serve(listener: UnixListener, ctx: Context, limits: field::listen::Limits) {
    let stats = ctx.console_stats.clone();
    field::console::serve_with(
        listener,
        limits,
        stats,
        ctx,
        |ctx, req: Request| async move { answer(&ctx, req).await },
    )
    .await
}

/// Serves the serial console, when one is configured, until the task is
/// aborted; its records go to the flash log.
pub fn start_serial(
    serial: Option<field::serial::SerialConsole>,
    ctx: Context,
) -> Option<tokio::task::JoinHandle<()>> {
    let recorder = ctx.recorder.clone();
    field::serial::start(serial, SerialHost(ctx), recorder, "read-only")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_line_of_json() {
        let r = Request::Events { since: Some(5) };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"cmd":"events","since":5}"#);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"why","gpu":3}"#).unwrap(),
            Request::Why { gpu: 3 }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"events"}"#).unwrap(),
            Request::Events { since: None }
        );
    }
}
