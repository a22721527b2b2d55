//! The configuration file as written and the flags over it: every field
//! optional, the common fields first (`loopwarden_field::agent_file!` and
//! `agent_flags!`), then the controller's own; unknown keys are refused
//! by the parser with their line. Also the errors of the TOML files a
//! field points at (register map, pin map), turned into a
//! [`ConfigError`] naming that file and its line.

use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use loopwarden_field::config::ConfigError;

loopwarden_field::agent_file! {
    /// The file as written (every field optional): the common fields
    /// (`loopwarden_field::common`), then the controller's own.
    pub struct FileConfig {
        /// CDU id.
        pub cdu: Option<String>,
        /// This controller's sign key file.
        pub sign_key: Option<PathBuf>,
        /// The public demonstration key (twin only).
        pub demo_key: Option<bool>,
        /// The keyring: the readers that may ask for logged events again.
        pub keyring: Option<PathBuf>,
        /// The CDU on Modbus TCP.
        pub cdu_tcp: Option<String>,
        /// The CDU on Modbus RTU.
        pub cdu_serial: Option<String>,
        /// Baud rate.
        pub serial_baud: Option<u32>,
        /// Parity.
        pub serial_parity: Option<String>,
        /// Data bits.
        pub serial_data_bits: Option<u8>,
        /// Stop bits.
        pub serial_stop_bits: Option<u8>,
        /// Register map file.
        pub register_map: Option<PathBuf>,
        /// Site figures file.
        pub site_figures: Option<PathBuf>,
        /// Host ids, rack-major.
        pub hosts: Option<Vec<String>>,
        /// Host id pattern.
        pub hosts_pattern: Option<String>,
        /// Control period, ms.
        pub period_ms: Option<u64>,
        /// Cap lease duration, ms.
        pub lease_ms: Option<u64>,
        /// Modbus request timeout, ms.
        pub modbus_timeout_ms: Option<u64>,
        /// Fallback outdoor temperature, °C (used only when no sensor
        /// reads).
        pub ambient_c: Option<f32>,
        /// Northbound Modbus TCP server for the BMS, `address:port`.
        pub northbound: Option<String>,
        /// The BMS may write the northbound holding registers.
        pub northbound_writes: Option<bool>,
        /// Writes on an unspecified address (every interface), on
        /// purpose: a protection switched off (file only).
        pub northbound_writes_any_address: Option<bool>,
        /// The unit id the northbound server answers.
        pub northbound_unit_id: Option<u8>,
        /// Connections the northbound server keeps open at once.
        pub northbound_max_connections: Option<usize>,
        /// Seconds before a northbound connection without a request is
        /// closed.
        pub northbound_idle_s: Option<u64>,
        /// Prometheus's `/metrics` on this address (`IP:PORT`).
        pub metrics_listen: Option<String>,
        /// The board's pin map file.
        pub board_pins: Option<PathBuf>,
        /// The GPIO chip of the board's pins.
        pub gpio_chip: Option<PathBuf>,
        /// The pin map's `rope_fault` lines are active high on purpose
        /// (an unplugged harness then reads dry): a protection switched
        /// off (file only).
        pub rope_fault_active_high: Option<bool>,
        /// Racks run without a leak rope, by number.
        pub unprotected_racks: Option<Vec<u8>>,
        /// Run without a flash file on purpose: what is latched (leaks,
        /// failed pumps) is lost at every restart.
        pub volatile_latch: Option<bool>,
        /// A hall of several CDUs: the CDU whose facility water plan
        /// every CDU follows (the hall's coordinator).
        pub facility_coordinator: Option<String>,
        /// The hall's CDUs, in order (needed on the coordinator).
        pub facility_cdus: Option<Vec<String>>,
    }
}

loopwarden_field::agent_flags! {
    /// Values given as flags, each overriding the file: the common fields,
    /// then the controller's own.
    pub struct Overrides {
        /// This CDU's id (ident); default: the machine's host name.
        #[arg(long)]
        pub cdu: Option<String>,
        /// This controller's sign key file (`ID.sign.key`), which cap
        /// leases are signed with.
        #[arg(long)]
        pub sign_key: Option<PathBuf>,
        /// Sign leases with the public demonstration key (the twin only:
        /// anyone can forge commands with it).
        #[arg(long)]
        pub demo_key: bool,
        /// The keyring (TOML, the hosts' format): the readers (operators,
        /// facility systems) that may ask this CDU to resend its logged
        /// events. Default: the demonstration readers with --demo-key,
        /// else none (every such request refused).
        #[arg(long)]
        pub keyring: Option<PathBuf>,
        /// The CDU on Modbus TCP, `host:port`.
        #[arg(long)]
        pub cdu_tcp: Option<String>,
        /// The CDU on Modbus RTU, a serial device such as /dev/ttyUSB0.
        #[arg(long)]
        pub cdu_serial: Option<String>,
        /// Serial baud rate.
        #[arg(long)]
        pub serial_baud: Option<u32>,
        /// Serial parity: none, even or odd.
        #[arg(long)]
        pub serial_parity: Option<String>,
        /// Serial data bits: 7 or 8.
        #[arg(long)]
        pub serial_data_bits: Option<u8>,
        /// Serial stop bits: 1 or 2.
        #[arg(long)]
        pub serial_stop_bits: Option<u8>,
        /// The CDU model's register map (TOML); required with a site sign
        /// key; with the demonstration key: the simulated CDU's.
        #[arg(long)]
        pub register_map: Option<PathBuf>,
        /// The hall's figures (site TOML); required with a site sign key;
        /// with the demonstration key: the twin's hall.
        #[arg(long)]
        pub site_figures: Option<PathBuf>,
        /// Run without a flash file on purpose: latched leaks and failed
        /// pumps are lost at every restart.
        #[arg(long)]
        pub volatile_latch: bool,
        /// Host ids in rack-major order, comma-separated.
        #[arg(long, value_delimiter = ',')]
        pub hosts: Vec<String>,
        /// Host ids from a pattern: `{rack}`, `{host}` (in its rack) and
        /// `{index}` (rack-major), `{index:02}` to pad.
        #[arg(long)]
        pub hosts_pattern: Option<String>,
        /// Control period in ms.
        #[arg(long)]
        pub period_ms: Option<u64>,
        /// Cap lease duration in ms.
        #[arg(long)]
        pub lease_ms: Option<u64>,
        /// Timeout of one Modbus request in ms.
        #[arg(long)]
        pub modbus_timeout_ms: Option<u64>,
        /// Fallback outdoor temperature, °C: used only when no sensor reads
        /// (the CDU's outdoor_temp, or a value the BMS wrote in the last
        /// 300 s), and then the controller raises an alarm.
        #[arg(long, allow_negative_numbers = true)]
        pub ambient_c: Option<f32>,
        /// Serve the northbound Modbus TCP map for the BMS here
        /// (`address:port`); default: no server.
        #[arg(long)]
        pub northbound: Option<String>,
        /// Let the BMS write the northbound holding registers (bounded
        /// setpoint ceiling, plan ceiling offset, alarm acknowledge).
        #[arg(long)]
        pub northbound_writes: Option<bool>,
        /// The Modbus unit id the northbound server answers, 1 to 247
        /// (255 always reaches it); default: 1.
        #[arg(long)]
        pub northbound_unit_id: Option<u8>,
        /// Connections the northbound server keeps open at once, 1 to 256
        /// (one more is closed at once); default 16.
        #[arg(long)]
        pub northbound_max_connections: Option<usize>,
        /// Seconds before a northbound connection that sends no request is
        /// closed, 1 to 3600; default 120.
        #[arg(long)]
        pub northbound_idle_s: Option<u64>,
        /// Serve Prometheus metrics at http://ADDR/metrics (`IP:PORT`, or
        /// `:PORT` for every interface); off by default.
        #[arg(long, value_name = "ADDR")]
        pub metrics_listen: Option<String>,
        /// The controller board's pin map (TOML): leak ropes and their fault
        /// inputs per rack, the controller-healthy relay, the alarm beacon;
        /// with --gpio-chip.
        #[arg(long)]
        pub board_pins: Option<PathBuf>,
        /// The GPIO character device of the board's pins, e.g. /dev/gpiochip0;
        /// with --board-pins.
        #[arg(long)]
        pub gpio_chip: Option<PathBuf>,
    }
}

/// A register map's error, with the line when the TOML parser gave one.
pub(super) fn board_error(
    path: &Path,
    _text: &str,
    e: loopwarden_boards::BoardError,
) -> ConfigError {
    let message = match &e {
        loopwarden_boards::BoardError::Syntax { message, .. }
        | loopwarden_boards::BoardError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    };
    // The TOML parser says "TOML parse error at line N, column M".
    let line = message
        .split_once("at line ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    ConfigError {
        origin: path.display().to_string(),
        line,
        message: message
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}
