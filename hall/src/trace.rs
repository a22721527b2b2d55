//! The run's trace: one CSV row every few seconds of simulated time.
//!
//! The columns are those `cooling-ctrl simulate --trace` writes
//! (`loopwarden_twin::sim::run`):
//!
//! ```text
//! t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,caps
//! ```
//!
//! The reader finds the columns by their header names, so their order does
//! not matter and columns it does not know are skipped; the optional
//! `quarantined` column (hosts with a GPU quarantined then) is read when it is there.
//! `max_gpu_c` is the hottest junction over every GPU of the hall, those
//! shut down included, as `simulate` takes it; its field is empty (read as
//! `None`) only for a hall with no GPU. The
//! writer ([`TraceRow::write_header`], [`TraceRow::write_row`]) writes the
//! same CSV, with the same precision, so a live run's trace reads and plots
//! like a simulated one.

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// The columns every trace has, in the order the writer puts them.
pub const COLUMNS: [&str; 11] = [
    "t_s",
    "ambient_c",
    "setpoint_c",
    "supply_c",
    "return_c",
    "flow_lpm",
    "pump_speed",
    "max_gpu_c",
    "it_kw",
    "facility_kw",
    "caps",
];

/// The optional column with the number of hosts with a GPU quarantined
/// then.
pub const QUARANTINED: &str = "quarantined";

/// One row of the trace: the hall at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Simulated time since the start, s.
    pub t_s: f64,
    /// Outdoor dry-bulb temperature, °C.
    pub ambient_c: f64,
    /// Supply setpoint the controller asked for, °C.
    pub setpoint_c: f64,
    /// Secondary-loop supply temperature, °C.
    pub supply_c: f64,
    /// Secondary-loop return temperature, °C.
    pub return_c: f64,
    /// Secondary-loop flow, L/min.
    pub flow_lpm: f64,
    /// Lead pump speed the controller asked for, 0 to 1.
    pub pump_speed: f64,
    /// Hottest GPU junction in the hall, °C, over every GPU (one shut
    /// down too); `None` (an empty field) where the hall has no GPU.
    pub max_gpu_c: Option<f64>,
    /// IT power (hosts), kW.
    pub it_kw: f64,
    /// Facility power (IT plus cooling), kW.
    pub facility_kw: f64,
    /// Hosts capped (`cooling-ctrl simulate` counts the hosts it asks a cap
    /// of).
    pub caps: u32,
    /// Hosts with a GPU quarantined then, when the trace has the
    /// `quarantined` column.
    pub quarantined: Option<u32>,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The reader failed.
    #[error("line {line}: {source}")]
    Io {
        /// 1-based line being read.
        line: usize,
        /// The reader's error.
        source: io::Error,
    },
    /// There is not even a header line.
    #[error("the trace is empty: it has no header line")]
    Empty,
    /// The header lacks a column every trace has.
    #[error("line 1: the header has no `{column}` column")]
    MissingColumn {
        /// The column's name.
        column: &'static str,
    },
    /// The header names a column twice.
    #[error("line 1: the header names `{column}` twice")]
    DuplicateColumn {
        /// The column's name.
        column: String,
    },
    /// A row has more or fewer fields than the header.
    #[error("line {line}: {found} fields, but the header has {expected}")]
    FieldCount {
        /// 1-based line.
        line: usize,
        /// Fields in the header.
        expected: usize,
        /// Fields on this line.
        found: usize,
    },
    /// A field does not hold what its column should.
    #[error("line {line}, column `{column}`: {value:?} is not {expected}")]
    BadValue {
        /// 1-based line.
        line: usize,
        /// The column's name.
        column: &'static str,
        /// The field as written.
        value: String,
        /// What the column holds.
        expected: &'static str,
    },
    /// Time went backwards.
    #[error("line {line}, column `t_s`: {t_s} s comes after {previous_s} s")]
    TimeBackwards {
        /// 1-based line.
        line: usize,
        /// This row's time.
        t_s: f64,
        /// The previous row's time.
        previous_s: f64,
    },
}

/// Where each known column sits in the header.
struct Layout {
    fields: usize,
    required: [usize; COLUMNS.len()],
    quarantined: Option<usize>,
}

impl Layout {
    fn from_header(header: &str) -> Result<Self, TraceError> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        for (i, n) in names.iter().enumerate() {
            if !n.is_empty() && names[..i].contains(n) {
                return Err(TraceError::DuplicateColumn {
                    column: (*n).to_string(),
                });
            }
        }
        let find = |c: &str| names.iter().position(|n| *n == c);
        let mut required = [0; COLUMNS.len()];
        for (slot, column) in required.iter_mut().zip(COLUMNS) {
            *slot = find(column).ok_or(TraceError::MissingColumn { column })?;
        }
        Ok(Layout {
            fields: names.len(),
            required,
            quarantined: find(QUARANTINED),
        })
    }
}

fn number(line: usize, column: &'static str, field: &str) -> Result<f64, TraceError> {
    match field.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(TraceError::BadValue {
            line,
            column,
            value: field.to_string(),
            expected: "a finite number",
        }),
    }
}

fn count(line: usize, column: &'static str, field: &str) -> Result<u32, TraceError> {
    field
        .trim()
        .parse::<u32>()
        .map_err(|_| TraceError::BadValue {
            line,
            column,
            value: field.to_string(),
            expected: "a whole count (0 or more)",
        })
}

/// Reads a whole trace: a header line, then one row a line. Blank lines are
/// skipped; a line ending in CR LF is read as one ending in LF.
pub fn read_trace<R: BufRead>(reader: R) -> Result<Vec<TraceRow>, TraceError> {
    let mut lines = reader.lines().enumerate();
    let layout = loop {
        match lines.next() {
            None => return Err(TraceError::Empty),
            Some((i, line)) => {
                let line = line.map_err(|source| TraceError::Io {
                    line: i + 1,
                    source,
                })?;
                let line = line.trim_end_matches('\r');
                if line.trim().is_empty() {
                    continue;
                }
                break Layout::from_header(line)?;
            }
        }
    };
    let mut rows: Vec<TraceRow> = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let line = line.map_err(|source| TraceError::Io { line: n, source })?;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != layout.fields {
            return Err(TraceError::FieldCount {
                line: n,
                expected: layout.fields,
                found: fields.len(),
            });
        }
        let f = |k: usize| number(n, COLUMNS[k], fields[layout.required[k]]);
        let row = TraceRow {
            t_s: f(0)?,
            ambient_c: f(1)?,
            setpoint_c: f(2)?,
            supply_c: f(3)?,
            return_c: f(4)?,
            flow_lpm: f(5)?,
            pump_speed: f(6)?,
            // An empty field is a hall with no GPU.
            max_gpu_c: match fields[layout.required[7]].trim() {
                "" => None,
                v => Some(number(n, COLUMNS[7], v)?),
            },
            it_kw: f(8)?,
            facility_kw: f(9)?,
            caps: count(n, COLUMNS[10], fields[layout.required[10]])?,
            quarantined: match layout.quarantined {
                // An empty field is a row that did not know.
                Some(k) if !fields[k].trim().is_empty() => Some(count(n, QUARANTINED, fields[k])?),
                _ => None,
            },
        };
        if let Some(prev) = rows.last() {
            if row.t_s < prev.t_s {
                return Err(TraceError::TimeBackwards {
                    line: n,
                    t_s: row.t_s,
                    previous_s: prev.t_s,
                });
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

impl TraceRow {
    /// Writes the header line; with `quarantined`, the header ends with the
    /// `quarantined` column. Pass the same flag to [`TraceRow::write_row`].
    pub fn write_header<W: Write + ?Sized>(w: &mut W, quarantined: bool) -> io::Result<()> {
        write!(w, "{}", COLUMNS.join(","))?;
        if quarantined {
            write!(w, ",{QUARANTINED}")?;
        }
        writeln!(w)
    }

    /// Writes this row as one line, with the precision of
    /// `cooling-ctrl simulate --trace` (0.01 °C, 0.1 L/min, 0.01 of pump
    /// speed, 0.01 kW; the time as it is). With `quarantined`, the line ends
    /// with the hosts with a GPU quarantined, empty when the row does not
    /// know.
    pub fn write_row<W: Write + ?Sized>(&self, w: &mut W, quarantined: bool) -> io::Result<()> {
        write!(
            w,
            "{},{:.2},{:.2},{:.2},{:.2},{:.1},{:.2},{},{:.2},{:.2},{}",
            self.t_s,
            self.ambient_c,
            self.setpoint_c,
            self.supply_c,
            self.return_c,
            self.flow_lpm,
            self.pump_speed,
            self.max_gpu_c.map_or(String::new(), |c| format!("{c:.2}")),
            self.it_kw,
            self.facility_kw,
            self.caps
        )?;
        if quarantined {
            write!(w, ",")?;
            if let Some(q) = self.quarantined {
                write!(w, "{q}")?;
            }
        }
        writeln!(w)
    }

    /// Power usage effectiveness of this instant: facility power over IT
    /// power; `None` while the IT power is zero.
    pub fn pue(&self) -> Option<f64> {
        (self.it_kw > 0.0).then(|| self.facility_kw / self.it_kw)
    }
}

/// The running PUE at each row: facility energy over IT energy since the
/// start (trapezoids between rows; the first row's is its own PUE). `None`
/// while no IT energy has been used.
pub fn running_pue(rows: &[TraceRow]) -> Vec<Option<f64>> {
    let mut it_kws = 0.0;
    let mut facility_kws = 0.0;
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        if i == 0 {
            out.push(r.pue());
            continue;
        }
        let p = &rows[i - 1];
        let dt = r.t_s - p.t_s;
        it_kws += dt * (p.it_kw + r.it_kw) / 2.0;
        facility_kws += dt * (p.facility_kw + r.facility_kw) / 2.0;
        out.push(if it_kws > 0.0 {
            Some(facility_kws / it_kws)
        } else {
            r.pue()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIM: &str = "\
t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,caps
0,41.00,32.00,41.00,42.49,192.0,1.00,42.38,107.24,135.36,0
10,41.01,32.00,40.59,44.75,192.0,1.00,53.16,108.80,136.96,2
";

    fn row(t: f64, caps: u32, quarantined: Option<u32>) -> TraceRow {
        TraceRow {
            t_s: t,
            ambient_c: 30.0 + t / 100.0,
            setpoint_c: 32.0,
            supply_c: 32.5,
            return_c: 40.25,
            flow_lpm: 192.5,
            pump_speed: 0.75,
            // A hall with no GPU has no hottest one.
            max_gpu_c: (t > 0.0).then_some(70.12),
            it_kw: 108.8,
            facility_kw: 136.96,
            caps,
            quarantined,
        }
    }

    #[test]
    fn reads_the_simulators_trace() {
        let rows = read_trace(SIM.as_bytes()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].t_s, 10.0);
        assert_eq!(rows[1].supply_c, 40.59);
        assert_eq!(rows[1].caps, 2);
        assert_eq!(rows[1].quarantined, None);
    }

    #[test]
    fn round_trip_without_and_with_quarantined() {
        for q in [false, true] {
            let rows: Vec<TraceRow> = (0..5)
                .map(|i| row(i as f64 * 10.0, i, q.then_some(i % 2)))
                .collect();
            let mut buf = Vec::new();
            TraceRow::write_header(&mut buf, q).unwrap();
            for r in &rows {
                r.write_row(&mut buf, q).unwrap();
            }
            assert_eq!(read_trace(&buf[..]).unwrap(), rows);
        }
    }

    #[test]
    fn the_header_matches_the_simulators() {
        let mut buf = Vec::new();
        TraceRow::write_header(&mut buf, false).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            SIM.lines().next().unwrap().to_string() + "\n"
        );
        let mut buf = Vec::new();
        read_trace(SIM.as_bytes()).unwrap()[0]
            .write_row(&mut buf, false)
            .unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            SIM.lines().nth(1).unwrap().to_string() + "\n"
        );
    }

    #[test]
    fn columns_found_by_name_extra_columns_accepted() {
        let csv = "\
note,caps,t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,quarantined
x,1,0,20,32,32,40,190,1,60,100,120,3
y,0,10,20,32,32,40,190,1,60,100,120,
";
        let rows = read_trace(csv.as_bytes()).unwrap();
        assert_eq!(rows[0].caps, 1);
        assert_eq!(rows[0].quarantined, Some(3));
        assert_eq!(rows[1].t_s, 10.0);
        assert_eq!(rows[1].quarantined, None);
    }

    #[test]
    fn malformed_line_names_line_and_column() {
        let csv = SIM.replace("40.59", "hot");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    line: 3,
                    column: "supply_c",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "line 3, column `supply_c`: \"hot\" is not a finite number"
        );
        let csv = SIM.replace(",2\n", ",-1\n");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    line: 3,
                    column: "caps",
                    ..
                }
            ),
            "{e:?}"
        );
        let csv = SIM.replace(",192.0,1.00,53.16", ",NaN,1.00,53.16");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    line: 3,
                    column: "flow_lpm",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn short_line_and_missing_column_and_backwards_time_refused() {
        let csv = SIM.replace(",0\n", "\n");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::FieldCount {
                    line: 2,
                    expected: 11,
                    found: 10
                }
            ),
            "{e:?}"
        );
        let csv = SIM.replace("flow_lpm", "flow");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(e, TraceError::MissingColumn { column: "flow_lpm" }),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "line 1: the header has no `flow_lpm` column");
        let csv = SIM.replace("\n10,", "\n-10,");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(
            matches!(e, TraceError::TimeBackwards { line: 3, .. }),
            "{e:?}"
        );
        let csv = SIM.replace("caps", "t_s");
        let e = read_trace(csv.as_bytes()).unwrap_err();
        assert!(matches!(e, TraceError::DuplicateColumn { .. }), "{e:?}");
        assert!(matches!(read_trace(&b"\n\n"[..]), Err(TraceError::Empty)));
    }

    #[test]
    fn crlf_and_blank_lines_accepted() {
        let csv = SIM.replace('\n', "\r\n") + "\r\n\r\n";
        assert_eq!(
            read_trace(csv.as_bytes()).unwrap(),
            read_trace(SIM.as_bytes()).unwrap()
        );
    }

    #[test]
    fn running_pue_is_energy_weighted() {
        let mut a = row(0.0, 0, None);
        let mut b = row(10.0, 0, None);
        let mut c = row(30.0, 0, None);
        a.it_kw = 100.0;
        a.facility_kw = 120.0;
        b.it_kw = 100.0;
        b.facility_kw = 120.0;
        c.it_kw = 100.0;
        c.facility_kw = 150.0;
        let p = running_pue(&[a, b, c]);
        assert!((p[0].unwrap() - 1.2).abs() < 1e-12);
        assert!((p[1].unwrap() - 1.2).abs() < 1e-12);
        // 1200 + 20 * 135 over 100 * 30.
        assert!((p[2].unwrap() - (1200.0 + 2700.0) / 3000.0).abs() < 1e-12);
    }
}
