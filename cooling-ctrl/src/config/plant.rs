//! The plant: the CDU's register map, the control core's configuration
//! (`cooling_core::CoreConfig`, from the site figures), the racks without
//! a leak rope, the host ids and this CDU's part in a hall of several
//! CDUs. With a site sign key the map and the figures must be given; the
//! simulated CDU's map and the twin's hall are the demonstration key's
//! defaults only.
//!
//! Glossary:
//! - *site figures*: the hall's TOML (`SiteConfig`: racks, hosts, GPUs,
//!   loop, heat rejection) the core's configuration is made from.
//! - *coordinator*: the CDU whose facility water plan every CDU of a hall
//!   follows.

use std::format;
use std::string::{String, ToString};
use std::vec::Vec;

use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::site::SiteConfig;
use loopwarden_field::config::{self as field, ConfigError, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::Ident;

use super::file::board_error;
use super::{FileConfig, Overrides};
use cooling_core::{CoreConfig, MAX_HOSTS};

/// What a CDU link with a site sign key may not leave out: the
/// simulated CDU's map and the twin's figures describe no real CDU.
fn required_on_a_real_link(src: &Sources, field: &str, what: &str) -> ConfigError {
    src.error(
        None,
        field,
        format!(
            "{field}: required with a site sign key: give {what}; the default is the twin's, for the demonstration key only"
        ),
    )
}

/// The CDU's register map: the file given; with the demonstration key
/// only, the simulated CDU's.
/// The register map when one is given (the gateway's: its
/// microcontroller carries the map it was built with), read and checked
/// as `run` reads it.
pub(super) fn register_map_if_given(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Option<RegisterMap>, ConfigError> {
    let given = flags.register_map.is_some() || file.register_map.is_some();
    given
        .then(|| register_map(src, file, flags, false))
        .transpose()
}

pub(super) fn register_map(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    demo: bool,
) -> Result<RegisterMap, ConfigError> {
    match pick!(flags.register_map, file.register_map, "register-map") {
        (None, _) if demo => Ok(RegisterMap::sim_cdu()),
        (None, _) => Err(required_on_a_real_link(
            src,
            "register_map",
            "this CDU model's register map (a TOML like boards/cdus/sim-cdu.toml)",
        )),
        (Some(p), flag) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "register_map",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            RegisterMap::from_toml(&t, &p.display().to_string()).map_err(|e| board_error(&p, &t, e))
        }
    }
}

/// The CDU's heartbeat timeout as the site figures say it
/// (`[loop] heartbeat_timeout_s`): the CDU falls back to its own control
/// when its heartbeat register goes unwritten this long.
pub(super) struct HeartbeatTimeout {
    /// The timeout, s.
    pub(super) s: f64,
    /// The figures that say it: their file, or the twin's.
    pub(super) figures: String,
}

/// The control core's configuration from the site figures, with the
/// CDU's heartbeat timeout where they give it, and a warning where a real
/// CDU's figures do not ([`core_config`]).
pub(super) struct Plant {
    pub(super) core: CoreConfig,
    pub(super) heartbeat: Option<HeartbeatTimeout>,
    /// The figures of a real CDU (no demonstration key) leave out its
    /// heartbeat timeout: the wait after a start takes 10 s.
    pub(super) no_heartbeat: Option<String>,
}

/// The control core's configuration from the site figures (the file
/// given; with the demonstration key only, the twin's hall), checked; its
/// errors name that file. With it the CDU's heartbeat timeout where the
/// figures say it (the twin's hall does: its CDU falls back after it),
/// refused unless a finite number of seconds above 0; figures that leave
/// the key out say nothing of the real CDU's (warned of without the
/// demonstration key).
pub(super) fn core_config(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    demo: bool,
) -> Result<Plant, ConfigError> {
    let (figures, figures_path, heartbeat) = match pick!(
        flags.site_figures,
        file.site_figures,
        "site-figures"
    ) {
        (None, _) if demo => {
            let twins = SiteConfig::default();
            let s = twins.secondary.heartbeat_timeout_s;
            (twins, None, Ok(Some(s)))
        }
        (None, _) => return Err(required_on_a_real_link(
            src,
            "site_figures",
            "the hall's figures (a site figures TOML: racks, hosts, GPUs, loop, heat rejection)",
        )),
        (Some(p), flag) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "site_figures",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            let figures: SiteConfig = field::parse(Some(&p), &t)?;
            let heartbeat = crate::site_figures::heartbeat_timeout_s(&t, &figures);
            (figures, Some(p), heartbeat)
        }
    };
    let figures_origin = || {
        figures_path
            .as_ref()
            .map_or("the twin's site figures".to_string(), |p| {
                p.display().to_string()
            })
    };
    let core = crate::site_figures::core_config(&figures).map_err(|e| ConfigError {
        origin: figures_origin(),
        line: None,
        message: format!("for the control core: {e}"),
    })?;
    core.validate().map_err(|e| ConfigError {
        origin: figures_origin(),
        line: None,
        message: format!("for the control core: {e}"),
    })?;
    let heartbeat = heartbeat.map_err(|message| ConfigError {
        origin: figures_origin(),
        line: None,
        message,
    })?;
    let no_heartbeat = (heartbeat.is_none() && !demo).then(|| {
        format!(
            "the site figures ({}) do not give the CDU's heartbeat timeout ([loop] \
             heartbeat_timeout_s): after a start the heartbeat waits at most 10 s for a \
             read-back, and the period is not checked against the CDU's timeout",
            figures_origin()
        )
    });
    let heartbeat = heartbeat.map(|s| HeartbeatTimeout {
        s,
        figures: figures_origin(),
    });
    Ok(Plant {
        core,
        heartbeat,
        no_heartbeat,
    })
}

/// The racks declared without a leak rope, as a mask; each must be a rack
/// of the hall, named once.
pub(super) fn unprotected(
    src: &Sources,
    file: &FileConfig,
    core: &CoreConfig,
) -> Result<u16, ConfigError> {
    let mut mask = 0u16;
    for &r in file.unprotected_racks.iter().flatten() {
        if r >= core.layout.racks {
            return Err(src.error(
                None,
                "unprotected_racks",
                format!(
                    "rack {r}: the hall has racks 0 to {}",
                    core.layout.racks - 1
                ),
            ));
        }
        if mask & (1 << r) != 0 {
            return Err(src.error(None, "unprotected_racks", format!("rack {r} appears twice")));
        }
        mask |= 1 << r;
    }
    Ok(mask)
}

/// The host ids: a list or a pattern (not both), at most the hall's
/// hosts, each a name, none twice.
pub(super) fn hosts(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    core: &CoreConfig,
) -> Result<Vec<Ident>, ConfigError> {
    let layout_hosts = core.layout.hosts().min(MAX_HOSTS);
    let hosts_flag = (!flags.hosts.is_empty()).then(|| flags.hosts.clone());
    let (names, hosts_from, hosts_key) = match (
        pick!(hosts_flag, file.hosts, "hosts"),
        pick!(flags.hosts_pattern, file.hosts_pattern, "hosts-pattern"),
    ) {
        ((Some(_), flag), (Some(_), _)) => {
            return Err(src.error(
                flag,
                "hosts",
                "hosts and hosts_pattern exclude each other".into(),
            ))
        }
        ((Some(list), flag), _) => (list, flag, "hosts"),
        (_, (Some(pattern), flag)) => (
            expand_hosts(
                &pattern,
                usize::from(core.layout.racks),
                usize::from(core.layout.hosts_per_rack),
            )
            .map_err(|m| src.error(flag, "hosts_pattern", m))?,
            flag,
            "hosts_pattern",
        ),
        _ => (Vec::new(), None, "hosts"),
    };
    if names.len() > layout_hosts {
        return Err(src.error(
            hosts_from,
            hosts_key,
            format!(
                "{} host ids for a hall of {layout_hosts} hosts ({} racks of {})",
                names.len(),
                core.layout.racks,
                core.layout.hosts_per_rack
            ),
        ));
    }
    let mut hosts: Vec<Ident> = Vec::with_capacity(names.len());
    for n in &names {
        let h = Ident::new(n).map_err(|e| {
            src.error(
                hosts_from,
                hosts_key,
                format!("host id {n:?} is not a name: {e}"),
            )
        })?;
        if hosts.contains(&h) {
            return Err(src.error(
                hosts_from,
                hosts_key,
                format!("host id {n:?} appears twice"),
            ));
        }
        hosts.push(h);
    }
    Ok(hosts)
}

/// What the host ids leave uncovered. With a site sign key none is
/// refused: telemetry is heard and leases sent only for the hosts
/// listed, so such a controller would cap no host, on a leak neither.
/// Fewer than the hall's hosts is said at start (`Some`, the warning):
/// the places after the last id are capped by nobody.
pub(super) fn hosts_cover(
    src: &Sources,
    hosts: &[Ident],
    core: &CoreConfig,
    demo: bool,
) -> Result<Option<String>, ConfigError> {
    let layout_hosts = core.layout.hosts().min(MAX_HOSTS);
    let per_rack = usize::from(core.layout.hosts_per_rack).max(1);
    match hosts.len() {
        0 if !demo => Err(src.error(
            None,
            "hosts",
            format!(
                "hosts: required with a site sign key: without `hosts` or `hosts_pattern` this \
                 controller hears no host and caps none, on a leak neither; give the {layout_hosts} \
                 hosts it cools, rack-major (hosts = [\"r0h0\", …]), or hosts_pattern = \"r{{rack}}h{{host}}\""
            ),
        )),
        n if n > 0 && n < layout_hosts => Ok(Some(format!(
            "hosts: {n} host ids for a hall of {layout_hosts} hosts ({} racks of {}): the hosts \
             from rack {}, place {} on get no cap from this controller, on a leak neither",
            core.layout.racks,
            core.layout.hosts_per_rack,
            n / per_rack,
            n % per_rack
        ))),
        _ => Ok(None),
    }
}

/// Builds host ids from a pattern for `racks` × `per_rack` hosts.
pub fn expand_hosts(pattern: &str, racks: usize, per_rack: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for index in 0..racks * per_rack {
        let (rack, host) = (index / per_rack.max(1), index % per_rack.max(1));
        let mut id = String::new();
        let mut rest = pattern;
        while let Some(open) = rest.find('{') {
            id.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("unclosed placeholder in {pattern:?}"))?;
            let inner = &rest[open + 1..open + close];
            let (name, width) = match inner.split_once(':') {
                Some((n, w)) => {
                    let width: usize = w
                        .trim_start_matches('0')
                        .parse()
                        .ok()
                        .filter(|_| w.starts_with('0'))
                        .ok_or_else(|| format!("{{{inner}}}: the width is written :02, :03 ..."))?;
                    (n, width)
                }
                None => (inner, 0),
            };
            let value = match name {
                "rack" => rack,
                "host" => host,
                "index" => index,
                other => {
                    return Err(format!(
                        "unknown placeholder {{{other}}} in {pattern:?}; known: {{rack}} {{host}} {{index}}"
                    ))
                }
            };
            id.push_str(&format!("{value:0width$}"));
            rest = &rest[open + close + 1..];
        }
        id.push_str(rest);
        out.push(id);
    }
    if out.len() > 1 && out[0] == out[1] {
        return Err(format!(
            "{pattern:?} gives every host the same id: use {{index}}, or {{rack}} and {{host}}"
        ));
    }
    Ok(out)
}

/// `facility_coordinator` and `facility_cdus`: this CDU's part in a hall of
/// several CDUs (the site figures' `cdus` above 1); the coordinator must
/// name the hall's CDUs, itself among them.
pub(super) fn facility_role(
    src: &Sources,
    file: &FileConfig,
    me: &Ident,
    core: &CoreConfig,
) -> Result<Option<crate::facility::FacilityRole>, ConfigError> {
    let Some(coordinator) = file.facility_coordinator.clone() else {
        if file.facility_cdus.is_some() {
            return Err(src.error(
                None,
                "facility_cdus",
                "facility_cdus needs facility_coordinator (the CDU that plans the hall's water)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    let id = |key: &str, v: &str| {
        Ident::new(v).map_err(|e| src.error(None, key, format!("{key}: {v:?} is not an id ({e})")))
    };
    let coordinator = id("facility_coordinator", &coordinator)?;
    if core.facility.cdus < 2 {
        return Err(src.error(
            None,
            "facility_coordinator",
            format!(
                "facility_coordinator = \"{coordinator}\": the site figures give one CDU on the facility water (set cdus to the hall's CDUs)"
            ),
        ));
    }
    let cdus = file
        .facility_cdus
        .iter()
        .flatten()
        .map(|c| id("facility_cdus", c))
        .collect::<Result<Vec<_>, _>>()?;
    if &coordinator == me && !cdus.contains(me) {
        return Err(src.error(
            None,
            "facility_cdus",
            format!("this CDU ({me}) coordinates the hall: facility_cdus must list the hall's CDUs, itself among them"),
        ));
    }
    if cdus.len() > usize::from(core.facility.cdus) {
        return Err(src.error(
            None,
            "facility_cdus",
            format!(
                "facility_cdus names {} CDUs, the site figures {} (cdus)",
                cdus.len(),
                core.facility.cdus
            ),
        ));
    }
    Ok(Some(crate::facility::FacilityRole { coordinator, cdus }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert_eq!(
            expand_hosts("gpu-{index:03}", 2, 2).unwrap(),
            ["gpu-000", "gpu-001", "gpu-002", "gpu-003"]
        );
        assert!(expand_hosts("h{index", 1, 2).is_err());
        assert!(expand_hosts("h{index:2}", 1, 2).is_err());
    }

    #[test]
    fn a_site_keyed_controller_needs_hosts_and_fewer_than_the_halls_are_said() {
        let core = cooling_core::CoreConfig::default();
        let src = Sources::new(Some(std::path::Path::new("cdu.toml")), "");
        let e = hosts_cover(&src, &[], &core, false).unwrap_err();
        assert!(
            e.message
                .starts_with("hosts: required with a site sign key")
                && e.message.contains("hosts_pattern"),
            "{e}"
        );
        assert_eq!(hosts_cover(&src, &[], &core, true).unwrap(), None);
        let all = core.layout.hosts().min(MAX_HOSTS);
        let ids = |n: usize| -> Vec<Ident> {
            (0..n)
                .map(|i| Ident::new(&format!("h{i}")).unwrap())
                .collect()
        };
        assert_eq!(hosts_cover(&src, &ids(all), &core, false).unwrap(), None);
        let said = hosts_cover(&src, &ids(all - 1), &core, false)
            .unwrap()
            .expect("one host short is said");
        assert!(
            said.starts_with(&format!(
                "hosts: {} host ids for a hall of {all} hosts",
                all - 1
            )),
            "{said}"
        );
    }
}
