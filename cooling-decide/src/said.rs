//! What the decision path has to say in the log, as typed values that
//! print as sentences ([`Said`]), and free text that flows in from the
//! shell (an error's words) held in a fixed buffer ([`Words`]).
//!
//! Glossary:
//! - *said*: a line for the log, with whether it is an error.
//! - *words*: text from outside the decision path (a flash or Modbus
//!   error as the shell put it), cut at [`WORDS`] bytes on a character
//!   boundary and marked with `…` when cut.

use core::fmt::{self, Display, Write as _};

/// The most bytes of outside text kept.
pub const WORDS: usize = 128;

/// Outside text, at most [`WORDS`] bytes.
pub type Words = heapless::String<WORDS>;

/// The marker of text that was cut.
const CUT: &str = "…";

/// A writer that keeps what fits, whole characters only.
struct Fitting<'a> {
    out: &'a mut Words,
    cut: bool,
}

impl fmt::Write for Fitting<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.cut {
            return Ok(());
        }
        let room = WORDS - self.out.len();
        if s.len() <= room {
            // Fits: cannot fail.
            let _ = self.out.push_str(s);
            return Ok(());
        }
        self.cut = true;
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let _ = self.out.push_str(&s[..end]);
        Ok(())
    }
}

/// `d` as it prints, cut on a character boundary to fit [`WORDS`] bytes
/// (with `…` at the end when cut).
pub fn words(d: &impl Display) -> Words {
    fit(d).0
}

/// `d` as [`words`] keeps it, and whether it was cut.
fn fit(d: &impl Display) -> (Words, bool) {
    let mut out = Words::new();
    let mut w = Fitting {
        out: &mut out,
        cut: false,
    };
    // The writer never fails; a Display that does leaves what it wrote.
    let _ = write!(w, "{d}");
    let cut = w.cut;
    if cut {
        let mut end = WORDS - CUT.len();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        let _ = out.push_str(CUT);
    }
    (out, cut)
}

/// Whether `a` and `b` print the same words (compared as they stream, no
/// buffer of either).
pub fn same_words(a: &impl Display, b: &impl Display) -> bool {
    /// Compares what is written with `want`, from `at`.
    struct Matching<'a> {
        want: &'a Words,
        at: usize,
        same: bool,
    }
    impl fmt::Write for Matching<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let end = self.at + s.len();
            self.same &= self.want.as_bytes().get(self.at..end) == Some(s.as_bytes());
            self.at = end;
            Ok(())
        }
    }
    let (want, cut) = fit(a);
    if cut {
        // Too long to hold: compared by the words that fit.
        return words(b) == want;
    }
    let mut m = Matching {
        want: &want,
        at: 0,
        same: true,
    };
    let _ = write!(m, "{b}");
    m.same && m.at == want.len()
}

/// A line for the log from the decision path.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Said {
    /// The map allows no lower setpoint than `map_c`; the site's dew
    /// point allowed `site_c`.
    LowestSetpoint {
        /// The map's lowest, °C.
        map_c: f32,
        /// The configured lowest, °C.
        site_c: f32,
    },
    /// The map allows no higher setpoint than `map_c`.
    HighestSetpoint {
        /// The map's highest, °C.
        map_c: f32,
        /// The configured highest, °C.
        configured_c: f32,
    },
    /// The map allows no lower pump speed than `map` (fraction).
    LowestSpeed {
        /// The map's lowest, fraction of full.
        map: f32,
        /// The configured lowest, fraction of full.
        configured: f32,
    },
    /// The latched record read at start cannot be believed, for `why`.
    RecordUnreadable {
        /// Why, as the shell said it.
        why: Words,
    },
    /// Racks latched by a relatch (bit n = rack n): those the CDU reports
    /// closed (`positions`), or all (the map reads no positions).
    Relatched {
        /// The racks latched.
        racks: u16,
        /// The map reads the valve positions.
        positions: bool,
    },
}

impl Said {
    /// It is an error (else a warning).
    pub fn error(&self) -> bool {
        match self {
            Said::RecordUnreadable { .. } => true,
            Said::Relatched { positions, .. } => !positions,
            _ => false,
        }
    }
}

impl Display for Said {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Said::LowestSetpoint { map_c, site_c } => write!(
                f,
                "lowest setpoint {map_c:.1} °C (the site's dew point allows {site_c:.1} °C, the CDU's register map takes no less than {map_c:.1} °C)"
            ),
            Said::HighestSetpoint { map_c, configured_c } => write!(
                f,
                "highest setpoint {map_c:.1} °C (configured {configured_c:.1} °C, the CDU's register map takes no more)"
            ),
            Said::LowestSpeed { map, configured } => write!(
                f,
                "lowest pump speed {:.0} % (configured {:.0} %, the CDU's register map takes no less)",
                map * 100.0,
                configured * 100.0
            ),
            Said::RecordUnreadable { why } => write!(
                f,
                "{why}; the record is kept as it is, no valve is written, and every rack whose valve the CDU reports closed is latched at its first answer"
            ),
            Said::Relatched { racks, positions } => {
                let how = if *positions {
                    "from the valves the CDU reports closed"
                } else {
                    "all of them: the CDU's map reads no valve positions"
                };
                write!(f, "racks latched {how}: {racks:#06b}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::{String, ToString};

    #[test]
    fn long_words_are_cut_on_a_character_boundary_and_marked() {
        assert_eq!(words(&"exception 3").as_str(), "exception 3");
        let long: String = "°".repeat(100); // 200 bytes
        let w = words(&long);
        assert!(w.len() <= WORDS && w.ends_with(CUT), "{w}");
        assert!(w.trim_end_matches(CUT).chars().all(|c| c == '°'));
        let exact: String = "a".repeat(WORDS);
        assert_eq!(words(&exact).as_str(), exact, "what fits is whole");
    }

    #[test]
    fn words_are_compared_as_they_print() {
        assert!(same_words(
            &"GPU 3 at 20 °C",
            &format_args!("GPU {} at 20 °C", 3)
        ));
        assert!(!same_words(&"GPU 3 at 20 °C", &"GPU 3 at 20 °"));
        assert!(!same_words(&"GPU 3", &"GPU 3 at"));
        let long: String = "x".repeat(300);
        assert!(same_words(&long, &long.clone()));
    }

    #[test]
    fn what_is_said_reads_as_before() {
        let s = Said::Relatched {
            racks: 0b0010,
            positions: true,
        };
        assert_eq!(
            s.to_string(),
            "racks latched from the valves the CDU reports closed: 0b0010"
        );
        assert!(!s.error());
        let s = Said::RecordUnreadable {
            why: words(&"cdu.latched: damaged"),
        };
        assert!(
            s.error()
                && s.to_string()
                    .starts_with("cdu.latched: damaged; the record")
        );
    }
}
