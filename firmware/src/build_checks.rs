//! The build script's checks of the board file (`build/board.rs`), the
//! figures record (`build/figures.rs`) and the register map
//! (`build/map.rs`), with what they read files with (`build/input.rs`),
//! compiled again here so that their tests run with the lib's host tests
//! (`cargo test --target x86_64-unknown-linux-gnu --lib`): `cargo test`
//! never runs a build script's own tests.

#[path = "../build/input.rs"]
mod input;

// The build script writes the board out; its tests here only load it.
#[allow(dead_code)]
#[path = "../build/board.rs"]
mod board;

#[path = "../build/figures.rs"]
mod figures;

// The build script writes the map out; its checks here only load it.
#[allow(dead_code)]
#[path = "../build/map.rs"]
mod map;

use input::read_toml;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use cooling_core::config::figures::encode;
    use cooling_core::CoreConfig;

    #[test]
    fn the_watchdogs_check_plans_on_the_steps_own_figures() {
        assert_eq!(
            super::board::STEP_BUDGET_MS * 1000,
            crate::budget::STEP_BUDGET_US
        );
        assert_eq!(super::board::LATCH_ITEMS, crate::budget::LATCH_ITEMS);
        assert_eq!(super::board::CLEAR_ITEMS, crate::budget::CLEAR_ITEMS);
    }

    /// A folder of its own for one test's files.
    fn folder(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn figures_the_firmware_would_refuse_stop_the_build_naming_the_file() {
        let d = folder("figures-build");
        let file = d.join("hall.bin");
        let mut cfg = CoreConfig::reference();
        cfg.layout.racks = 6;
        let good = encode(&cfg);
        std::fs::write(&file, good).unwrap();
        let (table, built, heartbeat) = super::figures::table(Some(&file), &d).unwrap();
        assert!(table.contains("include_bytes!"), "{table}");
        assert_eq!(built, cfg);
        assert_eq!(heartbeat, None);
        // One byte flipped: its CRC no longer holds.
        let mut flipped = good;
        flipped[20] ^= 0x01;
        std::fs::write(&file, flipped).unwrap();
        let e = super::figures::table(Some(&file), &d).unwrap_err();
        assert!(e.starts_with(&file.display().to_string()), "{e}");
        assert!(e.contains("CRC"), "{e}");
        // Cut short, or of another version.
        std::fs::write(&file, &good[..good.len() - 1]).unwrap();
        let e = super::figures::table(Some(&file), &d).unwrap_err();
        assert!(e.contains("not a figures record's"), "{e}");
        let mut other = good;
        other[4] ^= 0x7f;
        std::fs::write(&file, other).unwrap();
        let e = super::figures::table(Some(&file), &d).unwrap_err();
        assert!(e.contains("a figures record of version"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_map_whose_valve_word_cannot_hold_the_figures_racks_stops_the_build() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(here.join("../boards/cdus/sim-cdu.toml")).unwrap();
        let d = folder("map-racks");
        let file = d.join("narrow.toml");
        // The shipped map holds 16 racks' valves; one cut to 4 bits
        // holds 4 racks, not 6.
        let wide =
            "address = 3\ntype = \"u16\"\nscale = 1.0\nunit = \"\"\nmin = 0.0\nmax = 65535.0";
        assert_eq!(text.matches(wide).count(), 1);
        let narrow = text.replace(wide, &wide.replace("65535.0", "15.0"));
        std::fs::write(&file, narrow).unwrap();
        let m = super::map::Map::load(&file).unwrap();
        assert!(m.check_racks(4, "in hall.bin").is_ok());
        let e = m.check_racks(6, "in hall.bin").unwrap_err();
        assert!(e.starts_with(&file.display().to_string()), "{e}");
        assert!(e.contains("valves_open"), "{e}");
        assert!(e.contains("the 6 racks of the figures in hall.bin"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A map whose supply_setpoint range leaves no setpoint the site's
    /// figures take (the firmware holds the figures to the map at start,
    /// `cooling_decide::writes::tighten`, and refuses to run) stops the
    /// build, naming the map and both ranges.
    #[test]
    fn a_map_whose_setpoint_range_misses_the_figures_setpoints_stops_the_build() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(here.join("../boards/cdus/sim-cdu.toml")).unwrap();
        let d = folder("map-setpoint");
        let file = d.join("cold.toml");
        let range = "min = 17.0\nmax = 45.0\ndescription = \"supply temperature setpoint";
        assert_eq!(text.matches(range).count(), 1);
        let reference = CoreConfig::reference();
        // The shipped map's range is the reference hall's own.
        std::fs::write(&file, &text).unwrap();
        let m = super::map::Map::load(&file).unwrap();
        assert!(m.check_figures(&reference, "of the reference hall").is_ok());
        // 10 to 16 °C: below the reference hall's lowest setpoint, 17 °C.
        let cold = text.replace(
            range,
            &range.replace("17.0", "10.0").replace("45.0", "16.0"),
        );
        std::fs::write(&file, cold).unwrap();
        let m = super::map::Map::load(&file).unwrap();
        let e = m
            .check_figures(&reference, "of the reference hall")
            .unwrap_err();
        assert!(e.starts_with(&file.display().to_string()), "{e}");
        assert!(e.contains("supply_setpoint 10.0 to 16.0 °C"), "{e}");
        assert!(e.contains("from 17.0 °C"), "{e}");
        assert!(e.contains("to 45.0 °C"), "{e}");
        assert!(e.contains("the figures of the reference hall"), "{e}");
        // A range that meets the site's is held to, not refused.
        let narrow = text.replace(range, &range.replace("45.0", "30.0"));
        std::fs::write(&file, narrow).unwrap();
        let m = super::map::Map::load(&file).unwrap();
        assert!(m.check_figures(&reference, "of the reference hall").is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The bound of the wait after a start, generated from the record: the
    /// CDU's heartbeat timeout it carries, else 10 s (a version 1 record,
    /// one that does not give it, or no record at all).
    #[test]
    fn the_wait_after_a_start_is_the_records_heartbeat_timeout_else_10_s() {
        use cooling_core::config::figures::encode_with;
        use std::num::NonZeroU32;
        let d = folder("figures-heartbeat");
        let file = d.join("hall.bin");
        let cfg = CoreConfig::reference();
        let bound = |t: &str| {
            let b = t.lines().find(|l| l.contains("START_BOUND_MS: u64"));
            b.map(str::to_string).unwrap_or_default()
        };
        for (ms, want, said) in [
            (Some(30_000), 30_000, "30 s"),
            (Some(12_500), 12_500, "12.5 s"),
            (None, 10_000, "10 s"),
        ] {
            let ms = ms.and_then(NonZeroU32::new);
            std::fs::write(&file, encode_with(&cfg, ms)).unwrap();
            let (table, _, heartbeat) = super::figures::table(Some(&file), &d).unwrap();
            assert_eq!(heartbeat, ms);
            assert_eq!(
                bound(&table),
                format!("pub const START_BOUND_MS: u64 = {want};")
            );
            let timeout = ms.map_or("None".into(), |t| format!("Some({t})"));
            let line = format!("pub const HEARTBEAT_TIMEOUT_MS: Option<u32> = {timeout};");
            assert!(table.contains(&line), "{table}");
            let line = format!("pub const START_BOUND_SAID: &str = \"{said}\";");
            assert!(table.contains(&line), "{table}");
        }
        let (table, _, heartbeat) = super::figures::table(None, &d).unwrap();
        assert_eq!(heartbeat, None);
        assert_eq!(bound(&table), "pub const START_BOUND_MS: u64 = 10000;");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A control period above a third of the CDU's heartbeat timeout the
    /// figures give stops the build, naming the board file, the period,
    /// the timeout and the figures, as `run` refuses its `period_ms`; the
    /// shipped board's 1 s period fits a 3 s timeout and up.
    #[test]
    fn a_control_period_above_a_third_of_the_cdus_heartbeat_timeout_stops_the_build() {
        use super::figures::check_period;
        use std::num::NonZeroU32;
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let board = here.join("../boards/mcu/mps2-an386.toml");
        let period = super::board::Board::load(&board)
            .unwrap()
            .control_period_ms();
        assert_eq!(period, 1000);
        let source = "in hall.bin";
        assert!(check_period(period, &board, NonZeroU32::new(3000), source).is_ok());
        assert!(
            check_period(period, &board, None, source).is_ok(),
            "not given"
        );
        let e = check_period(period, &board, NonZeroU32::new(2999), source).unwrap_err();
        assert!(e.starts_with(&board.display().to_string()), "{e}");
        assert!(e.contains("timer.control.period_ms = 1000"), "{e}");
        assert!(e.contains("2999 ms (heartbeat_timeout_s"), "{e}");
        assert!(e.contains("in the figures in hall.bin"), "{e}");
        assert!(e.contains("at most 999 ms"), "{e}");
    }
}
