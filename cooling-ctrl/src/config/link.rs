//! How the CDU is reached: Modbus TCP (`cdu_tcp`) or Modbus RTU on a
//! serial line (`cdu_serial` and its `serial_` settings), exactly one.
//! The serial line is Modbus RTU, 8 data bits (7 is Modbus ASCII, which
//! the controller does not speak), and its speed must carry the longest
//! exchange with the CDU within `modbus_timeout_ms` ([`wire_fits`]).
//!
//! Glossary:
//! - *exchange*: one request and the CDU's answer to it.
//! - *turnaround*: the CDU's time between the end of a request and the
//!   start of its answer.

use std::format;
use std::string::String;
use std::time::Duration;

use loopwarden_boards::modbus_map::{input_spans, Kind, RegisterMap};
use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;

use super::plant::HeartbeatTimeout;
use super::timings::{least_period_ms, most_period_ms, most_timeout_ms};
use super::{FileConfig, Overrides};
use crate::modbus::{DataBits, Link, Parity, SerialLine, StopBits, TcpTarget};

/// The CDU link: exactly one of `cdu_tcp` and `cdu_serial`.
pub(super) fn cdu_link(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Link, ConfigError> {
    let serial = pick!(flags.cdu_serial, file.cdu_serial, "cdu-serial");
    match (pick!(flags.cdu_tcp, file.cdu_tcp, "cdu-tcp"), serial) {
        ((Some(_), flag), (Some(_), _)) => Err(src.error(
            flag,
            "cdu_tcp",
            "cdu_tcp and cdu_serial exclude each other: the CDU has one link".into(),
        )),
        ((None, _), (None, _)) => Err(src.error(
            None,
            "cdu_tcp",
            "a CDU link is required: cdu_tcp = \"host:port\" or cdu_serial = \"/dev/ttyUSB0\""
                .into(),
        )),
        ((Some(t), flag), _) => tcp_link(src, file, flags, &t, flag),
        (_, (Some(dev), _)) => serial_link(src, file, flags, dev),
    }
}

/// The CDU link when one is given (checked as [`cdu_link`] checks it),
/// else `None`: for the gateway, whose microcontroller reaches the CDU.
pub(super) fn cdu_link_if_given(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Option<Link>, ConfigError> {
    let given = [
        &file.cdu_tcp,
        &flags.cdu_tcp,
        &file.cdu_serial,
        &flags.cdu_serial,
    ]
    .iter()
    .any(|l| l.is_some());
    given.then(|| cdu_link(src, file, flags)).transpose()
}

/// A CDU on Modbus TCP at `t`: an address, and no serial settings.
fn tcp_link(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    t: &str,
    flag: Option<&str>,
) -> Result<Link, ConfigError> {
    let serial_set = [
        (
            "serial_baud",
            file.serial_baud.is_some() || flags.serial_baud.is_some(),
        ),
        (
            "serial_parity",
            file.serial_parity.is_some() || flags.serial_parity.is_some(),
        ),
        (
            "serial_data_bits",
            file.serial_data_bits.is_some() || flags.serial_data_bits.is_some(),
        ),
        (
            "serial_stop_bits",
            file.serial_stop_bits.is_some() || flags.serial_stop_bits.is_some(),
        ),
    ];
    if let Some((key, _)) = serial_set.iter().find(|(_, set)| *set) {
        return Err(src.error(
            None,
            key,
            format!("{key} is for a CDU on cdu_serial, not cdu_tcp"),
        ));
    }
    // Only its form: a name is looked up when connecting, so one that
    // does not resolve yet is retried, not a bad file.
    let target = t.parse::<TcpTarget>().map_err(|e| {
        src.error(
            flag,
            "cdu_tcp",
            format!("cdu_tcp = {t:?}: {e} (expected host:port)"),
        )
    })?;
    Ok(Link::Tcp(target))
}

/// A CDU on Modbus RTU at `dev`, with its line settings.
fn serial_link(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    dev: String,
) -> Result<Link, ConfigError> {
    let mut line = SerialLine::new(dev);
    line.baud = range(
        src,
        pick!(flags.serial_baud, file.serial_baud, "serial-baud"),
        "serial_baud",
        19_200,
        300,
        1_000_000,
        " baud",
    )?;
    line.parity = match pick!(flags.serial_parity, file.serial_parity, "serial-parity") {
        (None, _) => Parity::None,
        (Some(p), flag) => match p.as_str() {
            "none" => Parity::None,
            "even" => Parity::Even,
            "odd" => Parity::Odd,
            _ => {
                return Err(src.error(
                    flag,
                    "serial_parity",
                    format!("serial_parity = {p:?}: none, even or odd"),
                ))
            }
        },
    };
    let data_bits = pick!(
        flags.serial_data_bits,
        file.serial_data_bits,
        "serial-data-bits"
    );
    line.data_bits = match range(src, data_bits, "serial_data_bits", 8, 7, 8, " bits")? {
        7 => {
            return Err(src.error(
                data_bits.1,
                "serial_data_bits",
                "serial_data_bits = 7: Modbus RTU uses 8 data bits; 7 data bits is Modbus \
                 ASCII, which the controller does not speak (every request would go \
                 unanswered or garbled); set the CDU's port and serial_data_bits to 8"
                    .into(),
            ))
        }
        _ => DataBits::Eight,
    };
    line.stop_bits = match range(
        src,
        pick!(
            flags.serial_stop_bits,
            file.serial_stop_bits,
            "serial-stop-bits"
        ),
        "serial_stop_bits",
        1,
        1,
        2,
        " bits",
    )? {
        2 => StopBits::Two,
        _ => StopBits::One,
    };
    Ok(Link::Rtu(line))
}

/// The time allowed the CDU to turn a request round, ms: an allowance,
/// not a measurement (a CDU slower than this needs a timeout longer
/// still); the check refuses only a timeout that cannot be enough.
const TURNAROUND_MS: u64 = 50;

/// The common serial speeds above the slowest, baud: those a faster line
/// is offered at.
const BAUDS: [u32; 10] = [
    1_200, 2_400, 4_800, 9_600, 19_200, 38_400, 57_600, 115_200, 230_400, 460_800,
];

/// On a serial line, `modbus_timeout_ms` at least the time the longest
/// exchange with the CDU takes: its request and answer in characters and
/// the 3.5-character gap that ends the request, at the line's bits a
/// character and `serial_baud`, and [`TURNAROUND_MS`]. Shorter, every
/// such request times out as no answer, which reads as a cable fault.
/// The longest exchange is found in the map ([`longest_exchange`]); the
/// remedy offered ([`remedy`]) keeps within the longest period the CDU's
/// `heartbeat` allows.
pub(super) fn wire_fits(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    (link, map): (Option<&Link>, Option<&RegisterMap>),
    timeout: Duration,
    heartbeat: Option<&HeartbeatTimeout>,
) -> Result<(), ConfigError> {
    let (Some(Link::Rtu(line)), Some(map)) = (link, map) else {
        return Ok(());
    };
    let (chars, what) = longest_exchange(map);
    let bits = u64::from(line.bits_per_char());
    let wire_ms = wire_ms(chars, bits, line.baud);
    let need = wire_ms + TURNAROUND_MS;
    let have = timeout.as_millis() as u64;
    if have >= need {
        return Ok(());
    }
    let timeout_given = pick!(
        flags.modbus_timeout_ms,
        file.modbus_timeout_ms,
        "modbus-timeout-ms"
    );
    let (flag, key) = match timeout_given {
        (Some(_), flag) => (flag, "modbus_timeout_ms"),
        (None, _) => (
            pick!(flags.serial_baud, file.serial_baud, "serial-baud").1,
            "serial_baud",
        ),
    };
    let framing = line.to_string();
    let framing = framing.rsplit(' ').next().unwrap_or_default();
    Err(src.error(
        flag,
        key,
        format!(
            "modbus_timeout_ms = {have} is shorter than the longest exchange with the CDU \
             takes at serial_baud = {baud} ({framing}, {bits} bits a character): {what}, \
             {chars} characters and the 3.5-character gap that ends the request, take \
             {wire_ms} ms on the line, and {TURNAROUND_MS} ms are allowed for the CDU to \
             turn round: {need} ms at least, or every such request times out as no answer; \
             {remedy}",
            baud = line.baud,
            remedy = remedy(chars, bits, have, need, heartbeat),
        ),
    ))
}

/// The time `chars` characters of `bits` bits and the 3.5-character gap
/// take on a line of `baud`, ms, rounded up.
fn wire_ms(chars: usize, bits: u64, baud: u32) -> u64 {
    // In half characters: the 3.5-character gap is 7 halves.
    ((chars as u64 * 2 + 7) * bits * 1000).div_ceil(2 * u64::from(baud))
}

/// What fixes an exchange of `chars` characters of `bits` bits that
/// needs `need` ms where the timeout is `have`: a faster line, at the
/// least common speed the exchange fits `have` at where one does, or a
/// timeout of `need`, only where the period that needs is one the CDU's
/// `heartbeat` allows ([`most_period_ms`]); else a faster line and the
/// timeout it needs, within the longest timeout allowed.
fn remedy(
    chars: usize,
    bits: u64,
    have: u64,
    need: u64,
    heartbeat: Option<&HeartbeatTimeout>,
) -> String {
    let fits = |within: u64| {
        BAUDS
            .into_iter()
            .map(|b| (b, wire_ms(chars, bits, b) + TURNAROUND_MS))
            .find(|(_, n)| *n <= within)
    };
    let faster = match fits(have) {
        Some((b, _)) => format!("raise serial_baud to {b} or more (and the CDU's port with it)"),
        None => "raise serial_baud (and the CDU's port with it)".into(),
    };
    let (most, why) = most_period_ms(heartbeat);
    let period = least_period_ms(need);
    if period <= most {
        return format!(
            "{faster}, or set modbus_timeout_ms = {need} or more (which needs period_ms = \
             {period} or more)"
        );
    }
    let fix = match (fits(have), fits(most_timeout_ms(most))) {
        (None, Some((b, n))) => format!(
            "raise serial_baud to {b} or more (and the CDU's port with it) and \
             modbus_timeout_ms to {n} or more (which needs period_ms = {} or more)",
            least_period_ms(n)
        ),
        _ => faster,
    };
    format!(
        "{fix}: a timeout of {need} ms would need a period of {period} ms, longer \
         than the {most} ms allowed ({why})"
    )
}

/// The longest exchange the controller has with the CDU of `map`, in
/// characters (request and answer), and which it is: the read of its
/// longest span of input registers (request 8, answer 5 and 2 a
/// register), or a setting's write (a one-word write 8 and its echo 8; a
/// two-word write 9 and 2 a word, its echo 8; its read back 8 and 5 and
/// 2 a word, no more than its write), or the read-back of a run of
/// one-word settings (request 8, answer 5 and 2 a register: `read_back`).
fn longest_exchange(map: &RegisterMap) -> (usize, String) {
    let regs: std::vec::Vec<_> = map.registers().collect();
    let read_back = longest_read_back(map).map(|(start, n)| {
        let what = format!(
            "the read-back of holding {start}-{} ({n} settings: a request of 8 characters, \
             an answer of {})",
            u32::from(start) + u32::from(n) - 1,
            5 + 2 * usize::from(n)
        );
        (13 + 2 * usize::from(n), what)
    });
    let read = input_spans(regs.iter().copied())
        .into_iter()
        .map(|s| {
            let end = u32::from(s.start) + u32::from(s.count) - 1;
            let what = format!(
                "the read of input {}-{end} ({} registers: a request of 8 characters, \
                 an answer of {})",
                s.start,
                s.count,
                5 + 2 * usize::from(s.count)
            );
            (13 + 2 * usize::from(s.count), what)
        })
        .max_by_key(|(chars, _)| *chars);
    let write = regs
        .iter()
        .filter(|r| r.kind == Kind::Holding)
        .map(|r| {
            let words = usize::from(r.ty.words());
            let request = if words == 1 { 8 } else { 9 + 2 * words };
            let what = format!(
                "the write of {} (a request of {request} characters, an echo of 8)",
                r.name
            );
            (request + 8, what)
        })
        .max_by_key(|(chars, _)| *chars);
    let none = (0, "no request".into());
    [read, write, read_back]
        .into_iter()
        .flatten()
        .fold(none, |most, e| if e.0 > most.0 { e } else { most })
}

/// The longest run of contiguous one-word settings the controller reads
/// back in one request after a step's writes (the heartbeat left out; at
/// most 125): its first address and its count.
fn longest_read_back(map: &RegisterMap) -> Option<(u16, u16)> {
    let at = crate::modbus::SETTING_REGISTERS
        .iter()
        .filter(|n| **n != "heartbeat")
        .filter_map(|n| map.get(n))
        .filter(|r| r.kind == Kind::Holding && r.ty.words() == 1)
        .map(|r| r.address);
    let mut best: Option<(u16, u16)> = None;
    for run in crate::modbus::read_back_runs(at) {
        if Some(run.1) > best.map(|b| b.1) {
            best = Some(run);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{resolve, Config, ConfigError, Overrides};

    const RTU: &str = "cdu = \"cdu-1\"\ndemo_key = true\nembedded_broker = true\n\
                       cdu_serial = \"/dev/ttyUSB0\"\n";

    fn from(extra: &str) -> Result<Config, ConfigError> {
        let text = format!("{RTU}{extra}");
        resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default())
    }

    /// The CDU's link is Modbus RTU, 8 data bits; 7 is Modbus ASCII, and
    /// every request would come back as no answer or garbled.
    #[test]
    fn seven_data_bits_on_the_cdus_line_are_refused_as_modbus_ascii() {
        let e = from("serial_data_bits = 7\n").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.message.contains(
                "Modbus RTU uses 8 data bits; 7 data bits is Modbus ASCII, \
                 which the controller does not speak"
            ),
            "{e}"
        );
        assert!(from("serial_data_bits = 8\n").is_ok());
    }

    /// A map whose input spans are short: the read-back of its settings
    /// at holding 0-4 (a request of 8 characters, an answer of 15) is
    /// its longest exchange, longer than any write (16).
    #[test]
    fn the_read_back_of_the_settings_counts_in_the_longest_exchange() {
        let mut text = String::from("model = \"m\"\nword_order = \"high_first\"\nunit_id = 1\n");
        let regs = [
            ("pump_a_running", "input", 0),
            ("pump_b_running", "input", 100),
            ("supply_setpoint", "holding", 0),
            ("pump_speed", "holding", 1),
            ("lead_pump", "holding", 2),
            ("valves_open", "holding", 3),
            ("pumps_run", "holding", 4),
            ("heartbeat", "holding", 5),
        ];
        for (name, kind, address) in regs {
            let range = if kind == "holding" {
                "min = 0.0\nmax = 100.0\n"
            } else {
                ""
            };
            text += &format!(
                "[[register]]\nname = \"{name}\"\nkind = \"{kind}\"\naddress = {address}\n\
                 type = \"u16\"\nscale = 1.0\nunit = \"\"\ndescription = \"x\"\n{range}"
            );
        }
        let map = loopwarden_boards::modbus_map::RegisterMap::from_toml(&text, "test map")
            .expect("a valid map");
        let (chars, what) = super::longest_exchange(&map);
        assert_eq!(chars, 23, "{what}");
        assert!(
            what.starts_with("the read-back of holding 0-4 (5 settings"),
            "{what}"
        );
    }

    /// The simulated CDU's longest exchange is its read of input 10-20:
    /// an 8-character request and a 27-character answer, and the CDU's
    /// 3.5-character frame gap, 38.5 characters; at 1200 baud, 8E1 (11
    /// bits a character), 353 ms, and 50 ms for the CDU to turn round.
    #[test]
    fn a_modbus_timeout_shorter_than_the_longest_exchange_on_the_wire_is_refused() {
        let e1200 = "serial_baud = 1200\nserial_parity = \"even\"\n";
        let e = from(e1200).unwrap_err();
        for said in [
            "modbus_timeout_ms = 375",
            "serial_baud = 1200",
            "8E1",
            "the read of input 10-20",
            "403 ms",
        ] {
            assert!(e.message.contains(said), "{said}: {e}");
        }
        let at = |t: u64| {
            from(&format!(
                "{e1200}period_ms = 2000\nmodbus_timeout_ms = {t}\n"
            ))
        };
        assert!(at(403).is_ok());
        let e = at(402).unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        // 8N1 takes 10 bits a character: 321 ms and the margin.
        let n1200 = |t: u64| from(&format!("serial_baud = 1200\nmodbus_timeout_ms = {t}\n"));
        assert!(n1200(371).is_ok());
        assert!(n1200(370).is_err());
        // The default speed leaves the default timeout room to spare.
        assert!(from("").is_ok());
    }

    /// The simulated CDU's longest exchange at 300 baud, 8E1: 1412 ms on
    /// the line, 1462 ms with the turnaround. The timeout that needs asks
    /// for period_ms = 3899, which a CDU whose heartbeat times out after
    /// 10 s (the twin's) refuses (at most 3333 ms): only a faster line
    /// fits, and the error says so, naming the least common speed that
    /// fits the timeout.
    #[test]
    fn a_line_too_slow_for_any_period_the_heartbeat_allows_asks_for_a_faster_line_only() {
        let line = |baud: u32| format!("serial_baud = {baud}\nserial_parity = \"even\"\n");
        let e = from(&line(300)).unwrap_err();
        for said in [
            "the read of input 10-20",
            "1462 ms",
            "serial_baud to 2400 or more",
        ] {
            assert!(e.message.contains(said), "{said}: {e}");
        }
        // No period_ms the heartbeat refuses.
        for (i, _) in e.message.match_indices("period_ms = ") {
            let digits = e.message[i + 12..].split(|c: char| !c.is_ascii_digit());
            let p: u64 = digits.take(1).collect::<String>().parse().unwrap();
            assert!(p <= 3333, "period_ms = {p}: {e}");
        }
        assert!(!e.message.contains("set modbus_timeout_ms"), "{e}");
        // A timeout no speed fits: the speed and the timeout together.
        let e = from(&format!("{}modbus_timeout_ms = 40\n", line(300))).unwrap_err();
        let both = "raise serial_baud to 1200 or more (and the CDU's port with it) and \
                    modbus_timeout_ms to 403 or more (which needs period_ms = 1075 or more)";
        assert!(e.message.contains(both), "{e}");
        // The speed named fits the default timeout; the one below it not.
        from(&line(2400)).expect("2400 baud fits the default timeout");
        // Where a period the heartbeat allows fits, the timeout is offered.
        let e = from(&line(1200)).unwrap_err();
        assert!(
            e.message.contains(
                "set modbus_timeout_ms = 403 or more (which needs period_ms = 1075 or more)"
            ),
            "{e}"
        );
    }
}
