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
        let (table, built) = super::figures::table(Some(&file), &d).unwrap();
        assert!(table.contains("include_bytes!"), "{table}");
        assert_eq!(built, cfg);
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
}
