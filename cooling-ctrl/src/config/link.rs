//! How the CDU is reached: Modbus TCP (`cdu_tcp`) or Modbus RTU on a
//! serial line (`cdu_serial` and its `serial_` settings), exactly one.

use std::format;
use std::string::String;

use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;

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
    line.data_bits = match range(
        src,
        pick!(
            flags.serial_data_bits,
            file.serial_data_bits,
            "serial-data-bits"
        ),
        "serial_data_bits",
        8,
        7,
        8,
        " bits",
    )? {
        7 => DataBits::Seven,
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
