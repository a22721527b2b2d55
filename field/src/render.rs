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

/// The `events` answer (`{"events": [{"seq", "time_ms", "event"}]}`) as a
/// table, each event in words by `describe`; `no events` when empty.
pub fn events_table(v: &Value, describe: impl Fn(&Value) -> String) -> String {
    let rows: Vec<Vec<String>> = v["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    vec![
                        text(&e["seq"]),
                        clock(e["time_ms"].as_u64().unwrap_or(0)),
                        describe(&e["event"]),
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

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(events_table(&json!({"events": []}), text), "no events\n");
        let v = json!({"events": [{"seq": 7, "time_ms": 1_795_953_600_123u64, "event": "x"}]});
        assert_eq!(
            events_table(&v, text),
            "#  TIME (UTC)               EVENT\n7  2026-11-29 12:00:00.123  x\n"
        );
    }
}
