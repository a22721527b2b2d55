//! Settings an earlier release allowed and this one no longer does are
//! taken down to the nearest allowed value and said as an error naming the
//! key, the value given and the value used, so that an upgraded host still
//! starts (docs/security.md): a config refused at start would keep the
//! agent down, with no caps, guard or health.

use std::path::Path;
use std::time::Duration;

use node_agent::config::{self, Overrides};

mod logs;

const BASE: &str = "site = \"a\"\nhost = \"b\"\ntwin_gpus = 8\n";

/// `slow_counters_s` was 1 to 600 s; above 60 it is now read as 60.
#[test]
fn slow_counters_above_a_minute_are_read_as_60_s_and_said_naming_key_value_and_value_used() {
    let _one = logs::one_at_a_time();
    for s in [61, 90, 600] {
        let text = format!("{BASE}slow_counters_s = {s}\n");
        let (c, log) = logs::logged(|| {
            config::resolve(Some(Path::new("agent.toml")), &text, &Overrides::default())
        });
        let c = c.unwrap_or_else(|e| panic!("slow_counters_s = {s} stops the start: {e}"));
        assert_eq!(c.slow_counters, Duration::from_secs(60), "{s}");
        let said = logs::lines_with(
            &log,
            &[
                "ERROR",
                "agent.toml line 4",
                &format!("slow_counters_s = {s}"),
                "60 s is used",
            ],
        );
        assert_eq!(said.len(), 1, "slow_counters_s = {s}: {log}");
    }
    // From a flag too, named as the flag.
    let flags = Overrides {
        slow_counters_s: Some(90),
        ..Overrides::default()
    };
    let (c, log) = logs::logged(|| config::resolve(None, BASE, &flags));
    assert_eq!(c.expect("taken").slow_counters, Duration::from_secs(60));
    assert_eq!(
        logs::lines_with(
            &log,
            &[
                "ERROR",
                "flag --slow-counters-s",
                "slow_counters_s = 90",
                "60 s is used"
            ]
        )
        .len(),
        1,
        "{log}"
    );
}

/// A value allowed as it is says nothing; one that is no period at all
/// is still refused.
#[test]
fn slow_counters_within_range_say_nothing_and_0_is_refused() {
    let _one = logs::one_at_a_time();
    let text = format!("{BASE}slow_counters_s = 60\n");
    let (c, log) = logs::logged(|| {
        config::resolve(Some(Path::new("agent.toml")), &text, &Overrides::default())
    });
    assert_eq!(c.expect("taken").slow_counters, Duration::from_secs(60));
    assert!(
        logs::lines_with(&log, &["slow_counters_s"]).is_empty(),
        "{log}"
    );
    let text = format!("{BASE}slow_counters_s = 0\n");
    let e = config::resolve(Some(Path::new("agent.toml")), &text, &Overrides::default())
        .expect_err("0 s refused");
    assert!(
        e.to_string()
            .contains("slow_counters_s = 0 is out of range (1 to 60 s"),
        "{e}"
    );
    for bad in ["-5", "\"thirty\"", "1.5"] {
        let text = format!("{BASE}slow_counters_s = {bad}\n");
        let e = config::resolve(Some(Path::new("agent.toml")), &text, &Overrides::default())
            .expect_err("refused");
        assert_eq!(e.line, Some(4), "{bad}: {e}");
    }
}
