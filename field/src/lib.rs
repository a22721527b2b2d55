//! # loopwarden-field: what the agents share for the field engineer
//!
//! `node-agent` and `cooling-ctrl` each take a TOML configuration (a file,
//! a flag per field), start and stop the same way, and answer a console on
//! a local Unix socket. The mechanics are the same for both and live here;
//! each agent keeps its own requests, answers, renderings and fields.
//!
//! - [`console`]: binding the console socket (a stale one replaced, a file
//!   that is not a socket refused, mode 0660), serving one JSON line per
//!   connection, and the client side of `ctl` (connect, send, read the
//!   answer, exit status 2 when the peer cannot be asked).
//! - [`listen`]: the bounds on a listener (the console socket, the
//!   northbound Modbus server): a cap on open connections and an idle
//!   timeout, logged and counted.
//! - [`render`]: aligned tables and the cell text of a JSON value.
//! - [`serial`]: the serial console, a line shell on the agent's serial
//!   port answering the same commands, with a login for those that
//!   change state.
//! - [`time`]: `--since` and UTC clock times.
//! - [`common`]: the configuration fields every agent has (site, broker,
//!   login, keys file, flash, console), declared and checked once.
//! - [`config`]: the configuration error with its origin (file and line, a
//!   flag, or the default), the TOML key to line lookup, range checks and
//!   the [`pick!`] of a flag over the file.
//! - [`lifecycle`]: one process lifecycle for both agents: logging,
//!   configuration errors and exit statuses, the runtime, the watchdog and
//!   the signals, and the readers (console socket, serial console,
//!   `/metrics`) started and stopped together.
//! - [`watchdog`]: systemd's notify protocol (`READY=1`, `WATCHDOG=1`,
//!   `STOPPING=1`), with pings only while the agent's loop makes progress.
//!
//! Glossary:
//! - *origin*: where a configuration value came from, so an error points
//!   at it.
//! - *peer*: the running agent that `ctl` asks.

pub mod common;
pub mod config;
pub mod console;
pub mod lifecycle;
pub mod listen;
pub mod render;
pub mod serial;
pub mod time;
pub mod watchdog;
