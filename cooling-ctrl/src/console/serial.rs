//! The controller's serial console: the commands of `cooling-ctrl ctl`
//! on the board's serial port, answered and rendered as on the socket
//! (`loopwarden_field::serial` runs the line shell and the login).
//! `clear-leak` and `clear-pump` change the CDU's state: they need a
//! login, and go to the control loop as the socket's do, in the name of
//! the serial port (`serial-ttyS1`).

use std::sync::Arc;

use loopwarden_field::serial::request::{as_serial_shows, events_since, split, EVENTS};
use loopwarden_field::serial::session::Spec;
use loopwarden_field::serial::{Answer, Identity, SerialAgent};

use super::{answer, render, Context, Request};

/// The serial console's view of the controller.
pub struct SerialCdu(pub Arc<Context>);

const COMMANDS: &[Spec] = &[
    Spec {
        name: "status",
        args: "",
        summary: "the CDU at a glance: mode, temperatures, pumps, leaks, links",
        changes_state: false,
    },
    Spec {
        name: "sensors",
        args: "",
        summary: "every supervised sensor, its reading and fault",
        changes_state: false,
    },
    Spec {
        name: "loops",
        args: "",
        summary: "the optimiser's plan, the trims, what was learned",
        changes_state: false,
    },
    Spec {
        name: "caps",
        args: "",
        summary: "caps per host: asked, why, the last ack",
        changes_state: false,
    },
    EVENTS,
    Spec {
        name: "clear-leak",
        args: "RACK",
        summary: "reopen a rack whose leak is latched, after the repair",
        changes_state: true,
    },
    Spec {
        name: "clear-pump",
        args: "A|B",
        summary: "put a tripped pump back in service, after the repair",
        changes_state: true,
    },
];

/// The request a command line asks for, or why it is not one.
fn parse(words: &[String], now_ms: u64) -> Result<Request, String> {
    let (name, args) = split(words);
    match (name.as_str(), args.as_slice()) {
        ("status", []) => Ok(Request::Status),
        ("sensors", []) => Ok(Request::Sensors),
        ("loops", []) => Ok(Request::Loops),
        ("caps", []) => Ok(Request::Caps),
        ("events", args) => events_since(args, now_ms).map(|since| Request::Events { since }),
        ("clear-leak", [rack]) => rack
            .parse()
            .map(|rack| Request::ClearLeak { rack })
            .map_err(|_| format!("clear-leak {rack:?}: the rack is a number (0-based)")),
        ("clear-pump", [pump]) => Ok(Request::ClearPump {
            pump: pump.to_string(),
        }),
        _ => Err(Spec::usage(COMMANDS, &name)),
    }
}

impl SerialAgent for SerialCdu {
    fn identity(&self) -> Identity {
        Identity {
            program: "cooling-ctrl",
            version: env!("CARGO_PKG_VERSION"),
            role: "CDU",
            name: self.0.cdu.clone(),
            site: self.0.site.clone(),
        }
    }

    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }

    async fn run(&self, words: &[String], operator: &str) -> Answer {
        let parsed = parse(words, loopwarden_bus::now_ms().0);
        let ask = |req: Request| {
            // The whole log is minutes of a slow line: its last rows.
            let whole_log = matches!(req, Request::Events { since: None });
            as_serial_shows(whole_log, answer::answer_as(&self.0, req, operator))
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
        assert_eq!(parse(&words("status"), now), Ok(Request::Status));
        assert_eq!(
            parse(&words("events --since 10s"), now),
            Ok(Request::Events {
                since: Some(990_000)
            })
        );
        assert_eq!(
            parse(&words("clear-leak 2"), now),
            Ok(Request::ClearLeak { rack: 2 })
        );
        assert_eq!(
            parse(&words("clear-pump B"), now),
            Ok(Request::ClearPump { pump: "B".into() })
        );
        assert_eq!(
            parse(&words("clear-leak two"), now),
            Err("clear-leak \"two\": the rack is a number (0-based)".into())
        );
        assert_eq!(
            parse(&words("status now"), now),
            Err("usage: status (no arguments)".into())
        );
        assert_eq!(
            parse(&words("clear-pump"), now),
            Err("usage: clear-pump A|B".into())
        );
        assert!(parse(&words("events --since soon"), now).is_err());
    }
}
