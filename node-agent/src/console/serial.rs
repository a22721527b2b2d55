//! The agent's serial console: the commands of `node-agent ctl` on the
//! host's serial port, answered and rendered as on the socket
//! (`loopwarden_field::serial` runs the line shell and the login).
//!
//! Read-only, as the socket is: the one state change a host takes from
//! people, releasing a quarantined GPU, is a command signed by an
//! operator whose key the keyring holds, checked for replay and age and
//! kept whole in flash to be replayed after a restart
//! (`node_core::commands`). A local password is not that authority, so
//! the serial console offers no release; `login` works (and is logged)
//! for a uniform procedure on both agents.

use loopwarden_field::serial::request::{as_serial_shows, events_since, split, EVENTS};
use loopwarden_field::serial::session::Spec;
use loopwarden_field::serial::{Answer, Identity, SerialAgent};

use super::{answer, render, Context, Request};

/// The serial console's view of the agent.
pub struct SerialHost(pub Context);

const COMMANDS: &[Spec] = &[
    Spec {
        name: "status",
        args: "",
        summary: "the agent at a glance: GPUs, bus, sampling, health",
        changes_state: false,
    },
    Spec {
        name: "gpus",
        args: "",
        summary: "every GPU's last sample",
        changes_state: false,
    },
    Spec {
        name: "caps",
        args: "",
        summary: "limits in force and the leases behind them",
        changes_state: false,
    },
    EVENTS,
    Spec {
        name: "why",
        args: "GPU",
        summary: "why a GPU is in its state, its cap, its recent XIDs",
        changes_state: false,
    },
];

/// The request a command line asks for, or why it is not one.
fn parse(words: &[String], now_ms: u64) -> Result<Request, String> {
    let (name, args) = split(words);
    match (name.as_str(), args.as_slice()) {
        ("status", []) => Ok(Request::Status),
        ("gpus", []) => Ok(Request::Gpus),
        ("caps", []) => Ok(Request::Caps),
        ("events", args) => events_since(args, now_ms).map(|since| Request::Events { since }),
        ("why", [gpu]) => gpu
            .parse()
            .map(|gpu| Request::Why { gpu })
            .map_err(|_| format!("why {gpu:?}: the GPU is a number (0-based)")),
        _ => Err(Spec::usage(COMMANDS, &name)),
    }
}

impl SerialAgent for SerialHost {
    fn identity(&self) -> Identity {
        Identity {
            program: "node-agent",
            version: env!("CARGO_PKG_VERSION"),
            role: "host",
            name: self.0.host.clone(),
            site: self.0.site.clone(),
        }
    }

    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }

    async fn run(&self, words: &[String], _operator: &str) -> Answer {
        let parsed = parse(words, loopwarden_bus::now_ms().0);
        let ask = |req: Request| {
            // The whole log is minutes of a slow line: its last rows.
            let whole_log = matches!(req, Request::Events { since: None });
            as_serial_shows(whole_log, answer(&self.0, req))
        };
        Answer::asked(parsed, ask, render).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_lines_are_the_ctl_requests() {
        let now = 1_000_000;
        assert_eq!(parse(&words("gpus"), now), Ok(Request::Gpus));
        assert_eq!(
            parse(&words("events --since 1s"), now),
            Ok(Request::Events {
                since: Some(999_000)
            })
        );
        assert_eq!(parse(&words("why 3"), now), Ok(Request::Why { gpu: 3 }));
        assert_eq!(
            parse(&words("why x"), now),
            Err("why \"x\": the GPU is a number (0-based)".into())
        );
        assert_eq!(parse(&words("why"), now), Err("usage: why GPU".into()));
    }
}
