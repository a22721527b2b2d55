//! The field engineer's console: `cooling-ctrl ctl …` against the running
//! controller over a local Unix socket.
//!
//! One request per connection: a line of JSON (`{"cmd":"status"}`),
//! answered by a line of JSON. `cooling-ctrl ctl` prints it as aligned
//! tables, or as-is with `--json` for scripts. The socket is created with
//! mode 0660: whoever may read it may see the CDU's state; nothing on it
//! changes anything. Answers come from what the shell published after its
//! last step ([`ShellStats`]) and from the event log; the control loop is
//! never asked or waited for.
//!
//! Glossary:
//! - *request*: `status`, `sensors`, `loops`, `events` (with `since`, ms
//!   since the epoch) or `caps`.

use std::path::Path;
use std::string::String;
use std::sync::Arc;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_field as field;
use loopwarden_field::console::Peer;
pub use loopwarden_field::time::parse_since;
use loopwarden_protocol::TimestampMs;
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::journal::Recorder;
use crate::shell::{OperatorRequest, ShellStats};

mod answer;
mod render;

pub use answer::answer;
pub use render::render;

/// The controller, as `cooling-ctrl ctl` names it in its messages.
pub const PEER: Peer<'static> = Peer {
    who: "controller",
    program: "cooling-ctrl",
    default_socket: crate::config::default_console,
};

/// A console request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The CDU at a glance.
    Status,
    /// Every supervised sensor.
    Sensors,
    /// The optimiser and the trims.
    Loops,
    /// The event log.
    Events {
        /// Only events at or after this time (ms since the epoch).
        #[serde(default)]
        since: Option<u64>,
    },
    /// The caps per host.
    Caps,
    /// Reopen a rack whose leak is latched (its rope must read dry).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped pump (`A` or `B`) back in service.
    ClearPump {
        /// The pump.
        pump: String,
    },
}

/// What the console answers from.
#[derive(Debug, Clone)]
pub struct Context {
    /// Site.
    pub site: String,
    /// This CDU.
    pub cdu: String,
    /// Host ids, rack-major.
    pub hosts: Vec<String>,
    /// Hosts per rack.
    pub hosts_per_rack: usize,
    /// The CDU link, in words.
    pub link: String,
    /// The register map's model.
    pub map_model: String,
    /// The broker, in words.
    pub broker: String,
    /// Control period.
    pub period: Duration,
    /// Lease duration.
    pub lease: Duration,
    /// Leases are signed with the public demonstration key.
    pub demo_key: bool,
    /// When the controller started.
    pub started: TimestampMs,
    /// The shell's stats.
    pub stats: watch::Receiver<ShellStats>,
    /// The event log.
    pub recorder: Recorder,
    /// Where operators' requests go; `None`: the console is read-only.
    pub operator: Option<tokio::sync::mpsc::Sender<OperatorRequest>>,
}

/// Binds the console socket, replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    field::console::bind(path, "controller")
}

/// Answers connections until the task is dropped.
pub async fn serve(listener: UnixListener, ctx: Arc<Context>) {
    field::console::serve_callers(listener, move |req: Request, caller| {
        let ctx = ctx.clone();
        async move { answer(&ctx, req, caller).await }
    })
    .await
}

/// `x` rounded to `digits` decimals.
fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_operator_actions_are_one_line_of_json() {
        let r = Request::Events { since: Some(5) };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":"events","since":5}"#
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"sensors"}"#).unwrap(),
            Request::Sensors
        );
    }
}
