//! Answers rendered for people: aligned tables and the text of a cell.

use std::fmt::Write as _;

use serde_json::Value;

use crate::time::clock;

/// Aligned columns: a header row, then rows; two spaces between columns,
/// no trailing white space.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(l, "{c:<w$}  ", w = widths[i]);
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.iter().map(|s| s.to_string()).collect(), &mut out);
    for r in rows {
        line(r.clone(), &mut out);
    }
    out
}

/// A JSON value as a cell: `-` for null and the empty list, a string
/// without quotes, a list joined with commas.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// One row per item of the list `v`, made by `row` (none when `v` is
/// not a list).
pub fn rows_of(v: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array()
        .map(|a| a.iter().map(row).collect())
        .unwrap_or_default()
}

/// Each item of the list `v` [`fill`]ed into `template`, joined with
/// spaces; empty when there is none.
pub fn fill_each(v: &Value, template: &str) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| fill(x, template))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// `template` with each `{a.b}` replaced by the [`text`] of `v["a"]["b"]`
/// (a path of object keys); everything else is kept as written.
pub fn fill(v: &Value, template: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let path = &rest[open + 1..open + close];
        let value = path.split('.').fold(v, |v, key| &v[key]);
        out.push_str(&text(value));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Rows of `key  value`, the keys padded to the longest.
pub fn key_values(rows: &[(&str, String)]) -> String {
    let w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<w$}  {v}");
    }
    out
}

/// The resends of logged events in `status`, from the resender's counts
/// (`{"served", "frames", "refused", "withheld"}`): "3 served (12
/// frames), 1 refused, 4 withheld".
pub fn resends(v: &Value) -> String {
    fill(
        v,
        "{served} served ({frames} frames), {refused} refused, {withheld} withheld",
    )
}

/// The `events` answer (`{"events": [{"seq", "time_ms", "event", "text"}],
/// "queued_for_flash"}`) as a table, each event as its sentence; `no
/// events` when empty. Writes still queued for the flash when it was read
/// (a storm's) are said below it: their events are not in it yet; so are
/// the rows left out before it (`earlier`, a serial console's bound).
pub fn events_table(v: &Value) -> String {
    let mut out = events_rows(v);
    if let Some(n) = v["earlier"].as_u64().filter(|&n| n > 0) {
        out.push_str(&format!(
            "({n} earlier events not shown; `events --since T` shows those since T: 30s, 10m, 2h, 1d)\n"
        ));
    }
    match v["queued_for_flash"].as_u64() {
        Some(n) if n > 0 => out.push_str(&format!(
            "({n} writes were still queued for the flash: events among them are not shown yet; ask again)\n"
        )),
        _ => {}
    }
    out
}

fn events_rows(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    vec![
                        text(&e["seq"]),
                        clock(e["time_ms"].as_u64().unwrap_or(0)),
                        event_text(e),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        "no events\n".into()
    } else {
        table(&["#", "TIME (UTC)", "EVENT"], &rows)
    }
}

/// An event-log entry in words: its `text` (the agent's sentence), or
/// for an agent too old to send one, the name of its kind.
fn event_text(e: &Value) -> String {
    if let Some(t) = e["text"].as_str() {
        return t.to_string();
    }
    match e["event"].as_object().and_then(|o| o.keys().next()) {
        Some(name) => name.replace('_', " "),
        None => text(&e["event"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_filled_from_paths_of_the_answer() {
        let v = serde_json::json!({"a": 3, "bus": {"up": true, "n": "x"}, "none": null});
        assert_eq!(
            fill(&v, "{a} of {bus.n}, {bus.up}; {none} {missing}"),
            "3 of x, true; - -"
        );
        assert_eq!(fill(&v, "no fields"), "no fields");
    }

    #[test]
    fn resends_say_what_was_served_refused_and_withheld() {
        let v = serde_json::json!({"served": 3, "refused": 1, "withheld": 4, "frames": 12});
        assert_eq!(resends(&v), "3 served (12 frames), 1 refused, 4 withheld");
    }

    #[test]
    fn keys_are_padded_to_the_longest() {
        let rows = [("a", "1".to_string()), ("long", "2".to_string())];
        assert_eq!(key_values(&rows), "a     1\nlong  2\n");
    }
    use serde_json::json;

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
        let t = table(&["°C", "B"], &[vec!["1".into(), "y".into()]]);
        assert_eq!(t, "°C  B\n1   y\n");
    }

    #[test]
    fn cells_and_events() {
        assert_eq!(text(&json!(null)), "-");
        assert_eq!(text(&json!([])), "-");
        assert_eq!(text(&json!([1, "a"])), "1,a");
        assert_eq!(text(&json!("a")), "a");
        assert_eq!(events_table(&json!({"events": []})), "no events\n");
        assert_eq!(
            events_table(&json!({"events": [], "queued_for_flash": 2})),
            "no events\n(2 writes were still queued for the flash: events among them are not shown yet; ask again)\n"
        );
        assert_eq!(
            events_table(&json!({"events": [], "queued_for_flash": 0})),
            "no events\n"
        );
        let v = json!({"events": [{"seq": 9, "time_ms": 0, "text": "t"}], "earlier": 1234});
        let t = events_table(&v);
        assert!(
            t.ends_with(
                "(1234 earlier events not shown; `events --since T` shows those since T: 30s, 10m, 2h, 1d)\n"
            ),
            "{t}"
        );
        let v = json!({"events": [
            {"seq": 7, "time_ms": 1_795_953_600_123u64, "event": {"leak": {}}, "text": "rack 1: leak detected"},
            {"seq": 8, "time_ms": 1_795_953_600_123u64, "event": {"pump_seized": {}}},
        ]});
        assert_eq!(
            events_table(&v),
            "#  TIME (UTC)               EVENT\n\
             7  2026-11-29 12:00:00.123  rack 1: leak detected\n\
             8  2026-11-29 12:00:00.123  pump seized\n"
        );
    }
}
