//! The report's verdicts on differences between policies, each taken from
//! a paired difference's 95 % interval, never from two means alone.
//!
//! Glossary:
//! - *told apart*: a paired difference whose 95 % interval lies wholly
//!   above 0 or wholly below it; one holding 0 (or one trial, which has no
//!   interval) is not told apart from none.
//! - *drains pay up to r*: every false-flag rate swept from 0 to `r` has
//!   the drain policy's paired difference from the agent above 0; a rate
//!   above one that does not is not counted, however its own interval
//!   lies.

use super::study::{Difference, Swept};

/// A paired difference in points with its interval, and whether it is
/// told apart from none: "+0.41 ± 0.01 points (95 %)".
pub fn said(d: &Difference) -> String {
    let m = d.mean * 100.0;
    match d.half_width {
        None => format!("{m:+.2} points (one trial: no interval, not told apart from none)"),
        Some(h) if d.low() > 0.0 || d.high() < 0.0 => {
            format!("{m:+.2} ± {:.2} points (95 %)", h * 100.0)
        }
        Some(h) => format!(
            "{m:+.2} ± {:.2} points (95 %), not told apart from none at this number of trials",
            h * 100.0
        ),
    }
}

/// Where drains beat the agent alone among the false-flag rates swept, in
/// words: up to the largest rate `r` such that every rate swept from 0 to
/// `r` has its paired difference's 95 % interval above 0. A rate above a
/// gap (one whose interval holds 0 or lies below it) is not counted, and
/// is named.
pub fn drains_pay(swept: &[Swept]) -> String {
    let sure = |w: &Swept, above: bool| {
        let d = &w.vs_agent;
        d.half_width.is_some() && if above { d.low() > 0.0 } else { d.high() < 0.0 }
    };
    let mut swept: Vec<&Swept> = swept.iter().collect();
    swept.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let run = swept.iter().take_while(|w| sure(w, true)).count();
    let top = swept[..run].iter().rfind(|w| w.rate > 0.0);
    let n = swept.first().map_or(0, |w| w.vs_agent.trials);
    let past_gap: Vec<String> = swept[run..]
        .iter()
        .filter(|w| sure(w, true))
        .map(|w| format!("{:.1e}", w.rate))
        .collect();
    let gap = match (swept.get(run), past_gap.as_slice()) {
        (Some(w), [one]) => format!(
            " The interval at {one} lies above 0 too, but the one at {:.1e} below it does \
             not, so it is not counted.",
            w.rate
        ),
        (Some(w), many) if !many.is_empty() => format!(
            " The intervals at {} lie above 0 too, but the one at {:.1e} below them does \
             not, so they are not counted.",
            many.join(", "),
            w.rate
        ),
        _ => String::new(),
    };
    match top {
        Some(w) => format!(
            "\nDrains pay (beat the agent alone, both without false quarantines, the paired \
             difference's 95 % interval above 0 at every rate swept up to this one: {:+.3} ± \
             {:.3} points over {n} trials) up to {r:.1e} false flags per GPU-day among the rates \
             swept.{gap} Showing a rate that low with no false alarm seen takes 3.0 / {r:.1e} = \
             {:.0} clean GPU-days of replay (the 95 % one-sided Poisson bound).\n\n",
            w.vs_agent.mean * 100.0,
            w.vs_agent.half_width.unwrap_or(0.0) * 100.0,
            3.0 / w.rate,
            r = w.rate,
        ),
        None if swept.iter().all(|w| sure(w, false)) => {
            "\nDrains do not pay at any rate swept.\n\n".to_string()
        }
        None => {
            format!(
            "\n{}At no positive rate swept can drains be told apart from the agent alone (both \
             without false quarantines) as paying over {n} trials, counting a rate only where \
             every rate below it pays: each paired difference's 95 % interval holds 0 or lies \
             below it, or a lower rate's does{}.{gap}\n\n",
            if run > 0 { "Drains pay only with no false flag at all. " } else { "" },
            if n < 2 { ", and one trial gives no interval" } else { "" }
        )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest run of digits in `text`.
    fn longest_number(text: &str) -> usize {
        text.split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap_or(0)
    }

    /// Rates swept, each `(rate, mean difference from the agent, its
    /// half-width)` over `trials`.
    fn swept(rows: &[(f64, f64, Option<f64>)], trials: u32) -> Vec<Swept> {
        let row = |&(rate, mean, half_width): &(f64, f64, Option<f64>)| Swept {
            rate,
            ett: 0.9 + mean,
            vs_agent: Difference {
                key: "k",
                name: "n",
                mean,
                half_width,
                trials,
            },
        };
        rows.iter().map(row).collect()
    }

    #[test]
    fn drains_that_pay_only_without_false_flags_are_said_to_in_words() {
        let h = Some(0.001);
        let words = drains_pay(&swept(&[(0.0, 0.01, h), (1e-6, -0.01, h)], 9));
        assert!(longest_number(&words) <= 20, "{words}");
        assert!(words.contains("only with no false flag"), "{words}");
        let words = drains_pay(&swept(
            &[(0.0, 0.01, h), (1e-6, 0.005, h), (1e-5, -0.01, h)],
            9,
        ));
        assert!(
            words.contains("+0.500 ± 0.100 points over 9 trials) up to 1.0e-6 false flags"),
            "{words}"
        );
        assert!(words.contains("= 3000000 clean GPU-days"), "{words}");
        let words = drains_pay(&swept(&[(0.0, -0.01, h), (1e-6, -0.02, h)], 9));
        assert!(words.contains("do not pay at any rate swept"), "{words}");
    }

    #[test]
    fn drains_ahead_of_the_agent_within_the_interval_are_not_said_to_pay() {
        // Ahead by 0.1 point, ± 0.2: not told apart.
        let words = drains_pay(&swept(
            &[(0.0, 0.0, Some(0.0)), (3e-5, 0.001, Some(0.002))],
            200,
        ));
        assert!(!words.contains("Drains pay"), "{words}");
        assert!(words.contains("can drains be told apart"), "{words}");
        // One trial gives no interval: ahead by a point, yet not told apart.
        let words = drains_pay(&swept(&[(0.0, 0.01, None), (3e-5, 0.01, None)], 1));
        assert!(!words.contains("Drains pay"), "{words}");
        assert!(words.contains("one trial gives no interval"), "{words}");
    }

    #[test]
    fn drains_pay_only_up_to_the_first_rate_whose_interval_is_not_above_0() {
        let (h, wide) = (Some(0.001), Some(0.02));
        // 1e-6 is not told apart from the agent: 1e-5 paying above it is
        // not "pay up to 1e-5".
        let words = drains_pay(&swept(
            &[
                (0.0, 0.01, h),
                (1e-6, 0.005, wide),
                (1e-5, 0.004, h),
                (3e-5, -0.01, h),
            ],
            9,
        ));
        assert!(!words.contains("up to 1.0e-5"), "{words}");
        assert!(words.contains("only with no false flag"), "{words}");
        assert!(
            words.contains("1.0e-5"),
            "the rate left out is named: {words}"
        );
        // Every rate up to 1e-6 pays, 1e-5 holds 0, 3e-5 pays again.
        let words = drains_pay(&swept(
            &[
                (0.0, 0.01, h),
                (1e-6, 0.005, h),
                (1e-5, 0.004, wide),
                (3e-5, 0.004, h),
            ],
            9,
        ));
        assert!(words.contains(") up to 1.0e-6 false flags"), "{words}");
        assert!(!words.contains("up to 3.0e-5"), "{words}");
        // Without false flags drains are not told apart: they pay at no
        // rate, whatever a higher rate's interval says.
        let words = drains_pay(&swept(&[(0.0, 0.001, wide), (1e-6, 0.005, h)], 9));
        assert!(!words.contains("Drains pay"), "{words}");
    }

    #[test]
    fn a_difference_is_said_with_its_interval_and_whether_it_is_told_apart() {
        let d = |mean, half_width| Difference {
            key: "k",
            name: "n",
            mean,
            half_width,
            trials: 9,
        };
        assert_eq!(said(&d(0.004, Some(0.001))), "+0.40 ± 0.10 points (95 %)");
        assert_eq!(said(&d(-0.004, Some(0.001))), "-0.40 ± 0.10 points (95 %)");
        let near = said(&d(0.004, Some(0.005)));
        assert!(near.contains("not told apart from none"), "{near}");
        let one = said(&d(0.004, None));
        assert!(one.contains("one trial: no interval"), "{one}");
    }
}
