//! The line editor of the serial console: bytes in, the echo and the
//! finished lines out; no I/O, no clock.
//!
//! A serial terminal (`screen`, `minicom`, a terminal server) sends each
//! key as it is typed and shows only what the far end sends back, so the
//! editor echoes what it keeps. It keeps printable ASCII only: any other
//! byte (a control byte, a byte of 8 bits, line noise) is dropped, and so
//! is an escape sequence (an arrow key, a function key, a burst of noise
//! that starts with ESC); a control byte (or DEL, Backspace on PuTTY and
//! xterm) inside one ends it and is carried out (ECMA-48). CR, LF and CR LF each end a line; backspace and
//! DEL erase a character; Ctrl-U erases the line; Ctrl-C abandons it. A
//! line longer than [`MAX_LINE`] is kept out: it ends as [`Edit::TooLong`]
//! and nothing of it is acted on.
//!
//! Glossary:
//! - *echo*: the bytes sent back so the engineer sees what was kept.
//! - *hidden*: a line that is not echoed (a password).
//! - *escape sequence*: ESC, then `[` or `O` and the bytes of a control
//!   sequence up to its final byte (ECMA-48), or ESC and one byte; a
//!   control byte (below 0x20) or DEL ends it early.

/// The longest line kept, in characters.
pub const MAX_LINE: usize = 200;

/// The most bytes an escape sequence may take before it is dropped as
/// noise and the editor reads plainly again.
const MAX_ESCAPE: usize = 32;

const BS: u8 = 0x08;
const DEL: u8 = 0x7F;
const ESC: u8 = 0x1B;
const CTRL_C: u8 = 0x03;
const CTRL_U: u8 = 0x15;
const CR: u8 = b'\r';
const LF: u8 = b'\n';

/// What a byte finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// A line, as typed (printable ASCII, at most [`MAX_LINE`]).
    Line(String),
    /// A line longer than [`MAX_LINE`]: discarded.
    TooLong,
    /// Ctrl-C: the line was abandoned.
    Cancelled,
}

/// Where the editor is in an escape sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    /// Not in one.
    No,
    /// ESC seen.
    Start,
    /// In a control sequence (`ESC [` or `ESC O`), this many bytes in.
    Sequence(usize),
}

/// The line being typed.
#[derive(Debug, Clone)]
pub struct LineEditor {
    line: String,
    hidden: bool,
    overflow: bool,
    escape: Escape,
    after_cr: bool,
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

impl LineEditor {
    /// An empty line, echoed.
    pub fn new() -> Self {
        LineEditor {
            line: String::new(),
            hidden: false,
            overflow: false,
            escape: Escape::No,
            after_cr: false,
        }
    }

    /// Starts afresh as [`LineEditor::new`] does, but for a CR just
    /// taken: the LF of a CR LF that ended the last line still ends that
    /// line, not an empty one.
    pub fn restart(&mut self) {
        *self = LineEditor {
            after_cr: self.after_cr,
            ..LineEditor::new()
        };
    }

    /// Hides (or shows again) what is typed from now on.
    pub fn set_hidden(&mut self, hidden: bool) {
        self.hidden = hidden;
    }

    /// Whether what is typed is hidden.
    pub fn hidden(&self) -> bool {
        self.hidden
    }

    /// Takes one byte; its echo goes to `out`. Gives what the byte
    /// finished, if anything.
    pub fn feed(&mut self, byte: u8, out: &mut Vec<u8>) -> Option<Edit> {
        let after_cr = std::mem::replace(&mut self.after_cr, false);
        if self.in_escape(byte) {
            return None;
        }
        match byte {
            CR => {
                self.after_cr = true;
                Some(self.finish(out))
            }
            LF if after_cr => None,
            LF => Some(self.finish(out)),
            BS | DEL => {
                self.erase(1, out);
                None
            }
            CTRL_U => {
                self.erase(self.line.len(), out);
                self.overflow = false;
                None
            }
            CTRL_C => {
                self.line.clear();
                self.overflow = false;
                out.extend_from_slice(b"^C\r\n");
                Some(Edit::Cancelled)
            }
            ESC => {
                self.escape = Escape::Start;
                None
            }
            0x20..=0x7E => {
                self.keep(byte, out);
                None
            }
            _ => None,
        }
    }

    /// Whether `byte` belongs to an escape sequence (and is dropped). A
    /// control byte (below 0x20: Enter, Ctrl-C, Ctrl-U, Backspace, ESC)
    /// ends the sequence and is carried out, as ECMA-48 has it: an ESC
    /// typed by mistake never swallows the Enter after it. So does DEL,
    /// the Backspace key of PuTTY and xterm (never part of a sequence).
    fn in_escape(&mut self, byte: u8) -> bool {
        if byte < 0x20 || byte == DEL {
            self.escape = Escape::No;
            return false;
        }
        match self.escape {
            Escape::No => false,
            Escape::Start => {
                self.escape = match byte {
                    b'[' | b'O' => Escape::Sequence(0),
                    _ => Escape::No,
                };
                true
            }
            Escape::Sequence(n) => {
                // Parameters and intermediates (0x20 to 0x3F) go on; a
                // final byte (0x40 to 0x7E) or anything else ends it.
                let more = (0x20..=0x3F).contains(&byte) && n + 1 < MAX_ESCAPE;
                self.escape = if more {
                    Escape::Sequence(n + 1)
                } else {
                    Escape::No
                };
                true
            }
        }
    }

    fn keep(&mut self, byte: u8, out: &mut Vec<u8>) {
        if self.line.len() >= MAX_LINE {
            self.overflow = true;
            return;
        }
        self.line.push(char::from(byte));
        if !self.hidden {
            out.push(byte);
        }
    }

    fn erase(&mut self, n: usize, out: &mut Vec<u8>) {
        for _ in 0..n.min(self.line.len()) {
            self.line.pop();
            if !self.hidden {
                out.extend_from_slice(b"\x08 \x08");
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Edit {
        out.extend_from_slice(b"\r\n");
        let line = std::mem::take(&mut self.line);
        if std::mem::replace(&mut self.overflow, false) {
            Edit::TooLong
        } else {
            Edit::Line(line)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes`; the echo and what they finished.
    fn type_in(e: &mut LineEditor, bytes: &[u8]) -> (String, Vec<Edit>) {
        let mut out = Vec::new();
        let edits = bytes.iter().filter_map(|&b| e.feed(b, &mut out)).collect();
        (String::from_utf8(out).unwrap(), edits)
    }

    fn line(s: &str) -> Edit {
        Edit::Line(s.into())
    }

    #[test]
    fn cr_lf_and_crlf_each_end_one_line() {
        let mut e = LineEditor::new();
        let (echo, edits) = type_in(&mut e, b"a\rb\nc\r\nd\n\r");
        assert_eq!(
            edits,
            [line("a"), line("b"), line("c"), line("d"), line("")]
        );
        assert_eq!(echo, "a\r\nb\r\nc\r\nd\r\n\r\n");
    }

    #[test]
    fn backspace_del_and_ctrl_u_edit_and_ctrl_c_abandons() {
        let mut e = LineEditor::new();
        let (echo, edits) = type_in(&mut e, b"sty\x08\x7ftatus\r");
        assert_eq!(edits, [line("status")]);
        assert_eq!(echo, "sty\x08 \x08\x08 \x08tatus\r\n");
        // Erasing past the start erases nothing and echoes nothing.
        let (echo, edits) = type_in(&mut e, b"\x08\x08ab\x15gpus\r");
        assert_eq!(edits, [line("gpus")]);
        assert_eq!(echo, "ab\x08 \x08\x08 \x08gpus\r\n");
        let (echo, edits) = type_in(&mut e, b"clear-leak 3\x03help\r");
        assert_eq!(edits, [Edit::Cancelled, line("help")]);
        assert!(echo.contains("^C\r\n"), "{echo:?}");
    }

    #[test]
    fn noise_and_escape_sequences_are_dropped() {
        let mut e = LineEditor::new();
        // Arrow keys, a function key, 8-bit bytes, NUL, BEL, tab, a lone
        // ESC followed by a letter, an SS3 key.
        let (echo, edits) = type_in(
            &mut e,
            b"st\x1b[A\x1b[15~a\xff\x00\x07\t\xc3\xa9tu\x1bxs\x1bOP\r",
        );
        assert_eq!(edits, [line("status")]);
        assert_eq!(echo, "status\r\n");
        // A long run of parameter bytes after ESC [ ends the sequence
        // after MAX_ESCAPE bytes; what follows is read again.
        let mut noise = b"\x1b[".to_vec();
        noise.extend(std::iter::repeat_n(b'1', MAX_ESCAPE + 3));
        noise.extend_from_slice(b"\rok\r");
        let (_, edits) = type_in(&mut e, &noise);
        assert_eq!(edits, [line("111"), line("ok")]);
    }

    /// A control byte inside an escape sequence is carried out, as
    /// ECMA-48 says: Enter after a lone ESC still ends the line (it does
    /// not run into the next one), Ctrl-C inside `ESC [` still drops it.
    #[test]
    fn a_control_byte_ends_an_escape_sequence_and_is_carried_out() {
        let mut e = LineEditor::new();
        let (echo, edits) = type_in(&mut e, b"status\x1b\rgpus\r");
        assert_eq!(edits, [line("status"), line("gpus")]);
        assert_eq!(echo, "status\r\ngpus\r\n");
        let (_, edits) = type_in(&mut e, b"x\x1b[\x03");
        assert_eq!(edits, [Edit::Cancelled]);
        // Backspace and Ctrl-U too; ESC in a sequence starts a new one.
        let (_, edits) = type_in(&mut e, b"ab\x1b\x08\x1b[1\x15ok\x1b[\x1b[Ax\r");
        assert_eq!(edits, [line("okx")]);
    }

    /// Backspace as PuTTY and xterm send it (DEL, 0x7F) after a stray
    /// Esc, or inside `ESC [`, erases as it does anywhere else.
    #[test]
    fn backspace_sent_as_del_inside_an_escape_sequence_still_erases() {
        let mut e = LineEditor::new();
        let (echo, edits) = type_in(&mut e, b"ab\x1b\x7f\r");
        assert_eq!(edits, [line("a")]);
        assert_eq!(echo, "ab\x08 \x08\r\n");
        let (_, edits) = type_in(&mut e, b"ab\x1b[1\x7f\r");
        assert_eq!(edits, [line("a")]);
    }

    #[test]
    fn a_line_too_long_is_discarded_whole() {
        let mut e = LineEditor::new();
        let long = vec![b'x'; MAX_LINE + 1];
        let (echo, edits) = type_in(&mut e, &long);
        assert!(edits.is_empty());
        assert_eq!(echo.len(), MAX_LINE, "the excess is not echoed");
        let (_, edits) = type_in(&mut e, b"\r");
        assert_eq!(edits, [Edit::TooLong]);
        let (_, edits) = type_in(&mut e, &[vec![b'y'; MAX_LINE], b"\r".to_vec()].concat());
        assert_eq!(edits, [Edit::Line("y".repeat(MAX_LINE))]);
        // Ctrl-U forgives an overflow.
        let (_, edits) = type_in(&mut e, &[long, b"\x15ok\r".to_vec()].concat());
        assert_eq!(edits, [line("ok")]);
    }

    #[test]
    fn a_hidden_line_echoes_only_its_end() {
        let mut e = LineEditor::new();
        e.set_hidden(true);
        let (echo, edits) = type_in(&mut e, b"s3cret\x08t\r");
        assert_eq!(edits, [line("s3cret")]);
        assert_eq!(echo, "\r\n");
    }
}
