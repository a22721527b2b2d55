//! Operators' clears through the gateway. The microcontroller acts only
//! on a clear its operator signed (it checks the Ed25519 signature
//! against the keyring built into its firmware), so the gateway cannot
//! make one up, and checks none: it carries each to the MCU and the
//! MCU's answer back.
//!
//! - The operator signs: `cooling-ctrl ctl clear-leak RACK --sign-key FILE
//!   --cdu NAME` builds the [`Clear`] (this CDU, the operator of the sign
//!   key, an id that rises: [`clear_id`], the time, the action) and signs
//!   it with the operator's own key ([`sign`]), then asks the gateway on
//!   its console socket with a [`GatewayRequest`].
//! - The gateway's console ([`serve`]) hands it to the gateway's loop
//!   ([`ClearAsk`]), which sends it as `Down::Clear` and waits for the
//!   MCU's `Up::Answer` with its id ([`Pending`]) at most
//!   [`ANSWER_WITHIN_MS`]; the answer goes back to `ctl` ([`ClearOutcome`]).
//! - [`firmware_keyring`] writes the keyring the firmware is built with
//!   (`LOOPWARDEN_FIRMWARE_OPERATORS`) from the site's keyring: its
//!   operators' public keys.
//!
//! Glossary:
//! - *signed bytes*: [`CLEAR_CONTEXT`], then the clear's postcard bytes
//!   ([`signed_bytes`]): what the signature covers.

use std::fmt::Write as _;
use std::string::String;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_bus::keys::{hex, SignKey};
use loopwarden_field::console::{Caller, Limits, ListenStats};
use loopwarden_link::message::CLEAR_CONTEXT;
use loopwarden_link::{Clear, ClearAction, SignedClear};
use loopwarden_protocol::auth::{Signature, Signer, SigningKey, VerifyingKey};
use loopwarden_protocol::message::Pump;
use loopwarden_protocol::{Ident, Role, TimestampMs};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

/// How long the gateway waits for the MCU's answer to a clear, ms.
pub const ANSWER_WITHIN_MS: u64 = 10_000;

/// The most operators the firmware's keyring holds.
pub const FIRMWARE_OPERATORS_MAX: usize = 16;

/// The longest signed bytes of a clear (the firmware checks a clear in a
/// buffer this long).
const SIGNED_MAX: usize = 160;

/// What `ctl` asks a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum GatewayRequest {
    /// Carry this signed clear to the microcontroller.
    SignedClear {
        /// The clear, signed by its operator.
        clear: SignedClear,
    },
}

/// A clear's id from the wall clock: Unix seconds, so that each clear an
/// operator signs is above the last (the MCU refuses one that is not),
/// until 2106.
pub fn clear_id(unix_ms: u64) -> u32 {
    (unix_ms / 1000).min(u64::from(u32::MAX)) as u32
}

/// The most waits [`signing_ms`] makes for a second of its own.
const SIGNING_WAITS: usize = 3;

/// The wall clock to sign a clear at: the first reading of `now` (Unix
/// ms) in a later second than the first reading, waiting with `sleep`
/// (at most about a second). A clear's id is its second, so clears asked
/// one after another (a script's `clear-leak 2` then `clear-pump B`)
/// each get an id of their own and the MCU takes both; without the wait
/// the second would be refused as a replay. After three waits
/// (`SIGNING_WAITS`; a wall clock stepped back) it signs at the last
/// reading, and a replay refusal says so.
pub fn signing_ms(mut now: impl FnMut() -> u64, mut sleep: impl FnMut(Duration)) -> u64 {
    let mut at = now();
    let first = clear_id(at);
    for _ in 0..SIGNING_WAITS {
        if clear_id(at) > first {
            break;
        }
        sleep(Duration::from_millis(1000 - at % 1000));
        at = now();
    }
    at
}

/// What a clear's signature covers: [`CLEAR_CONTEXT`], then the clear's
/// postcard bytes.
pub fn signed_bytes(clear: &Clear) -> Result<Vec<u8>, String> {
    let mut buf = [0u8; SIGNED_MAX];
    let head = CLEAR_CONTEXT.len();
    buf[..head].copy_from_slice(CLEAR_CONTEXT);
    let body = postcard::to_slice(clear, &mut buf[head..])
        .map_err(|e| format!("the clear does not encode in {SIGNED_MAX} bytes: {e}"))?
        .len();
    Ok(buf[..head + body].to_vec())
}

/// `clear` signed with the operator's key `key_id` (`key`).
pub fn sign(clear: Clear, key_id: u8, key: &SigningKey) -> Result<SignedClear, String> {
    use ed25519_dalek::Signer as _;
    let sig = key.sign(&signed_bytes(&clear)?);
    Ok(SignedClear {
        clear,
        key_id,
        signature: [*sig.r_bytes(), *sig.s_bytes()],
    })
}

/// Whether `key` signed `c` (strict RFC 8032, as the MCU checks it).
pub fn verifies(c: &SignedClear, key: &VerifyingKey) -> bool {
    let sig = Signature::from_components(c.signature[0], c.signature[1]);
    signed_bytes(&c.clear).is_ok_and(|m| key.verify_strict(&m, &sig).is_ok())
}

/// The clear of `action` for CDU `cdu`, signed at `unix_ms` with the
/// operator's sign key `key` (its operator names the clear); refused for
/// a key that is not an operator's.
pub fn operator_clear(
    key: &SignKey,
    cdu: Ident,
    action: ClearAction,
    unix_ms: u64,
) -> Result<SignedClear, String> {
    if key.node.role != Role::Operator {
        return Err(format!(
            "--sign-key is the key of {}/{}, not an operator's (operator/NAME): a clear is signed by the operator who asks",
            key.node.role.as_str(),
            key.node.id
        ));
    }
    let clear = Clear {
        id: clear_id(unix_ms),
        cdu,
        operator: key.node.id.clone(),
        at: TimestampMs(unix_ms),
        action,
    };
    sign(clear, key.key_id, &key.key)
}

/// A leak's clear for rack `rack`, as `ctl clear-leak` takes it.
pub fn leak(rack: usize) -> Result<ClearAction, String> {
    u8::try_from(rack)
        .ok()
        .filter(|r| *r < 16)
        .map(ClearAction::Leak)
        .ok_or_else(|| format!("rack {rack}: a CDU has racks 0 to 15"))
}

/// A pump's clear for `pump` (`A` or `B`), as `ctl clear-pump` takes it.
pub fn pump(pump: &str) -> Result<ClearAction, String> {
    match pump {
        "A" | "a" => Ok(ClearAction::Pump(Pump::A)),
        "B" | "b" => Ok(ClearAction::Pump(Pump::B)),
        other => Err(format!("pump {other:?}: A or B")),
    }
}

/// What a clear clears, in words.
pub fn action_words(a: ClearAction) -> String {
    match a {
        ClearAction::Leak(rack) => format!("rack {rack}'s leak"),
        ClearAction::Pump(p) => format!("{p}'s fault"),
    }
}

/// A clear for the gateway's loop, and where its outcome goes.
#[derive(Debug)]
pub struct ClearAsk {
    /// The clear as signed.
    pub clear: SignedClear,
    /// Who asked on the console socket (`uid-1000`), for the log.
    pub caller: String,
    /// The outcome.
    pub reply: oneshot::Sender<ClearOutcome>,
}

/// What became of a clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearOutcome {
    /// The MCU took it and did it.
    Done,
    /// The MCU refused it, in its words.
    Refused(String),
    /// It never reached the MCU's line: why.
    NotSent(String),
    /// The MCU did not answer within [`ANSWER_WITHIN_MS`].
    NoAnswer,
}

/// The console's answer for clear `c` that came to `outcome`, as `ctl`
/// prints it (`done`, `refused`, else an error).
pub fn answer_json(c: &Clear, outcome: &ClearOutcome) -> Value {
    let what = format!(
        "{} (clear {} of {})",
        action_words(c.action),
        c.id,
        c.operator
    );
    match outcome {
        ClearOutcome::Done => {
            json!({ "ok": true, "done": format!("{what}: cleared by the microcontroller") })
        }
        ClearOutcome::Refused(why) => {
            json!({ "ok": false, "refused": format!("{what}: the microcontroller refuses: {why}") })
        }
        ClearOutcome::NotSent(why) => {
            json!({ "error": format!("{what} was not sent to the microcontroller: {why}") })
        }
        ClearOutcome::NoAnswer => json!({ "error": format!(
            "{what}: the microcontroller did not answer within {} s (it may be silent, or a frame was lost): whether it was taken is not known; ask again (a new clear has a new id)",
            ANSWER_WITHIN_MS / 1000
        ) }),
    }
}

/// The clears sent to the MCU that wait for its answer, each with where
/// its answer goes (`R`) and until when (steady ms).
#[derive(Debug)]
pub struct Pending<R> {
    waiting: Vec<(u32, u64, R)>,
}

impl<R> Default for Pending<R> {
    fn default() -> Self {
        Self {
            waiting: Vec::new(),
        }
    }
}

impl<R> Pending<R> {
    /// Clear `id`, sent at `now_ms`, waits for its answer.
    pub fn wait(&mut self, id: u32, now_ms: u64, reply: R) {
        let until = now_ms.saturating_add(ANSWER_WITHIN_MS);
        self.waiting.push((id, until, reply));
    }

    /// Whether a clear of `id` waits for its answer: the MCU's answer
    /// names a clear by its id alone, so a second clear of that id (two
    /// operators signing in the same second) is not sent meanwhile.
    pub fn waits(&self, id: u32) -> bool {
        self.waiting.iter().any(|(w, _, _)| *w == id)
    }

    /// The MCU answered clear `id`: where the answer goes (the first that
    /// waits with that id), if anyone waits.
    pub fn answered(&mut self, id: u32) -> Option<R> {
        let i = self.waiting.iter().position(|(w, _, _)| *w == id)?;
        Some(self.waiting.remove(i).2)
    }

    /// The clears whose wait ran out at `now_ms`, taken out.
    pub fn expired(&mut self, now_ms: u64) -> Vec<(u32, R)> {
        let (out, keep) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, until, _)| *until <= now_ms);
        self.waiting = keep;
        out.into_iter().map(|(id, _, r)| (id, r)).collect()
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// None waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// The gateway's console socket: answers signed clears (handed to the
/// gateway's loop on `clears`) until the task is dropped, within
/// `limits`; anything else is answered with an error that says where to
/// look instead.
pub async fn serve(
    listener: UnixListener,
    limits: Limits,
    stats: ListenStats,
    clears: mpsc::Sender<ClearAsk>,
) {
    loopwarden_field::console::serve_callers(listener, limits, stats, move |req: Value, caller| {
        let clears = clears.clone();
        async move { answer(req, caller, &clears).await }
    })
    .await
}

/// The answer to one console request.
async fn answer(req: Value, caller: Caller, clears: &mpsc::Sender<ClearAsk>) -> Value {
    let cmd = req["cmd"].as_str().unwrap_or("");
    match cmd {
        "signed_clear" => {}
        "clear_leak" | "clear_pump" => {
            return json!({ "error": "this is the gateway of a controller on a microcontroller, which takes only a clear its operator signed: give --sign-key FILE --cdu NAME" })
        }
        other => {
            return json!({ "error": format!(
                "the gateway carries only operators' signed clears, not {other:?}: the CDU's state is on the bus (lwbus watch) and on the gateway's /metrics"
            ) })
        }
    }
    let GatewayRequest::SignedClear { clear } = match serde_json::from_value(req) {
        Ok(r) => r,
        Err(e) => return json!({ "error": format!("a signed clear that does not read: {e}") }),
    };
    let (reply, outcome) = oneshot::channel();
    let plain = clear.clear.clone();
    let ask = ClearAsk {
        clear,
        caller: caller.operator(),
        reply,
    };
    if clears.send(ask).await.is_err() {
        return json!({ "error": "the gateway's loop has stopped" });
    }
    // The loop answers within its own wait; a little more here.
    let wait = Duration::from_millis(ANSWER_WITHIN_MS + 2_000);
    match tokio::time::timeout(wait, outcome).await {
        Ok(Ok(o)) => answer_json(&plain, &o),
        Ok(Err(_)) => json!({ "error": "the gateway's loop dropped the clear" }),
        Err(_) => answer_json(&plain, &ClearOutcome::NoAnswer),
    }
}

/// The firmware's operator keyring (the file named by
/// `LOOPWARDEN_FIRMWARE_OPERATORS` when the firmware is built) for CDU
/// `cdu`: every operator among `signers` (the site's keyring) that may
/// `release` (an operator's right to return what was taken out of
/// service; an operator who may only `resend`, a watcher, clears
/// nothing), with its key id and public key. Refused with none, or more
/// than the firmware keeps.
pub fn firmware_keyring(cdu: &Ident, signers: &[Signer]) -> Result<String, String> {
    let ops: Vec<&Signer> = signers
        .iter()
        .filter(|s| s.role == Role::Operator && s.may.release)
        .collect();
    if ops.is_empty() {
        return Err("the keyring holds no operator (node = \"operator/NAME\") that may release (may = [\"release\"]): the firmware would refuse every clear".into());
    }
    if ops.len() > FIRMWARE_OPERATORS_MAX {
        return Err(format!(
            "the keyring holds {} operator keys; the firmware keeps at most {FIRMWARE_OPERATORS_MAX}",
            ops.len()
        ));
    }
    let mut out = format!(
        "# The operators whose signed clears the firmware of CDU {cdu} acts on:\n\
         # public keys, safe to copy. Build with LOOPWARDEN_FIRMWARE_OPERATORS=<this file>.\n\
         cdu = \"{cdu}\"\n"
    );
    for s in ops {
        let Some(name) = &s.name else {
            return Err("an operator of any name (operator/*) cannot clear: name each".into());
        };
        let _ = write!(
            out,
            "\n[[operator]]\nname = \"{name}\"\nkey_id = {}\npublic_key = \"{}\"\n",
            s.key_id,
            hex(s.key.as_bytes())
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::auth::May;
    use loopwarden_protocol::NodeId;

    const NOW: u64 = 1_700_000_000_123;

    fn operator_key(seed: u8) -> SignKey {
        SignKey {
            node: NodeId::new(Role::Operator, "jdoe").unwrap(),
            key_id: 2,
            key: SigningKey::from_bytes(&[seed; 32]),
        }
    }

    /// A wall clock that `sleep` moves on, `step_back_ms` back at the
    /// first sleep (an NTP step), and a little on at each reading.
    fn clock(start_ms: u64, step_back_ms: u64) -> (impl FnMut() -> u64, impl FnMut(Duration)) {
        let t = std::rc::Rc::new(std::cell::Cell::new((start_ms, step_back_ms)));
        let (read, slept) = (t.clone(), t);
        let now = move || {
            let (ms, back) = read.get();
            read.set((ms + 3, back));
            ms
        };
        let sleep = move |d: Duration| {
            let (ms, back) = slept.get();
            slept.set((ms + d.as_millis() as u64 - back, 0));
        };
        (now, sleep)
    }

    #[test]
    fn clears_asked_one_after_another_each_get_a_second_of_their_own() {
        let mut ids = Vec::new();
        let mut t = NOW;
        for _ in 0..3 {
            // Each clear asked the moment the one before was signed.
            let (now, sleep) = clock(t, 0);
            let at = signing_ms(now, sleep);
            assert!(at - t <= 1_000, "waited {} ms", at - t);
            ids.push(clear_id(at));
            t = at;
        }
        let first = clear_id(NOW);
        assert_eq!(ids, [first + 1, first + 2, first + 3]);
        // Asked on the last millisecond of a second: a wait of one.
        let (now, sleep) = clock(1_700_000_000_999, 0);
        let at = signing_ms(now, sleep);
        assert!((1_700_000_001_000..1_700_000_001_010).contains(&at), "{at}");
        // A clock stepped back 10 s: the wait ends, at the time it reads.
        let (now, sleep) = clock(NOW, 10_000);
        let at = signing_ms(now, sleep);
        assert!(clear_id(at) <= clear_id(NOW), "{at}");
    }

    #[test]
    fn a_clear_is_signed_over_the_context_and_its_bytes_by_the_operator_of_the_key() {
        let k = operator_key(7);
        let cdu = Ident::new("cdu-1").unwrap();
        let c = operator_clear(&k, cdu.clone(), leak(2).unwrap(), NOW).unwrap();
        assert_eq!(c.clear.operator.as_str(), "jdoe");
        assert_eq!((c.key_id, c.clear.cdu.clone()), (2, cdu));
        assert_eq!(c.clear.id, 1_700_000_000);
        assert_eq!(c.clear.at, TimestampMs(NOW));
        assert!(verifies(&c, &k.key.verifying_key()));
        let bytes = signed_bytes(&c.clear).unwrap();
        assert!(bytes.starts_with(b"loopwarden-link clear\0"));
        // Another key does not verify it, and neither does a changed clear.
        assert!(!verifies(&c, &operator_key(8).key.verifying_key()));
        let mut changed = c.clone();
        changed.clear.action = ClearAction::Leak(3);
        assert!(!verifies(&changed, &k.key.verifying_key()));
        // A CDU's key signs no clear.
        let cdu_key = SignKey {
            node: NodeId::new(Role::Cdu, "cdu-1").unwrap(),
            ..k
        };
        let e = operator_clear(
            &cdu_key,
            Ident::new("cdu-1").unwrap(),
            leak(0).unwrap(),
            NOW,
        )
        .unwrap_err();
        assert!(e.contains("not an operator's"), "{e}");
    }

    #[test]
    fn racks_and_pumps_read_as_the_link_names_them() {
        assert_eq!(leak(15), Ok(ClearAction::Leak(15)));
        assert!(leak(16).unwrap_err().contains("0 to 15"));
        assert_eq!(pump("b"), Ok(ClearAction::Pump(Pump::B)));
        assert!(pump("C").unwrap_err().contains("A or B"));
    }

    #[test]
    fn a_signed_clear_goes_through_the_console_as_one_json_line() {
        let c = operator_clear(
            &operator_key(7),
            Ident::new("cdu-1").unwrap(),
            pump("A").unwrap(),
            NOW,
        )
        .unwrap();
        let req = GatewayRequest::SignedClear { clear: c.clone() };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with("{\"cmd\":\"signed_clear\""), "{line}");
        assert!(line.len() < loopwarden_field::console::MAX_REQUEST);
        assert_eq!(serde_json::from_str::<GatewayRequest>(&line).unwrap(), req);
    }

    #[test]
    fn each_outcome_reads_as_ctl_prints_it() {
        let c = operator_clear(
            &operator_key(7),
            Ident::new("cdu-1").unwrap(),
            leak(2).unwrap(),
            NOW,
        )
        .unwrap()
        .clear;
        let v = answer_json(&c, &ClearOutcome::Done);
        assert_eq!(v["ok"], true);
        assert_eq!(
            v["done"],
            "rack 2's leak (clear 1700000000 of jdoe): cleared by the microcontroller"
        );
        let v = answer_json(
            &c,
            &ClearOutcome::Refused("its rope still reads wet".into()),
        );
        assert_eq!(v["ok"], false);
        assert!(v["refused"]
            .as_str()
            .unwrap()
            .ends_with("refuses: its rope still reads wet"));
        let v = answer_json(&c, &ClearOutcome::NoAnswer);
        assert!(v["error"]
            .as_str()
            .unwrap()
            .contains("did not answer within 10 s"));
        let v = answer_json(&c, &ClearOutcome::NotSent("the line is not open".into()));
        assert!(v["error"].as_str().unwrap().contains("was not sent"));
    }

    #[test]
    fn an_answer_goes_to_the_first_that_waits_with_its_id_and_waits_run_out() {
        let mut p = Pending::default();
        p.wait(5, 0, "first");
        p.wait(5, 100, "second");
        p.wait(6, 200, "other");
        assert_eq!(p.answered(7), None);
        assert_eq!(p.answered(5), Some("first"));
        assert!(p.expired(ANSWER_WITHIN_MS + 99).is_empty());
        assert_eq!(p.expired(ANSWER_WITHIN_MS + 100), vec![(5, "second")]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.answered(6), Some("other"));
        assert!(p.is_empty());
    }

    #[test]
    fn a_clear_of_an_id_that_waits_is_known_to_wait_until_answered_or_expired() {
        let mut p = Pending::default();
        assert!(!p.waits(5));
        p.wait(5, 0, "first");
        assert!(p.waits(5) && !p.waits(6));
        assert_eq!(p.answered(5), Some("first"));
        assert!(!p.waits(5), "answered: a new clear of that id may go");
        p.wait(5, 0, "again");
        p.expired(ANSWER_WITHIN_MS);
        assert!(!p.waits(5), "expired");
    }

    fn signer(role: Role, name: &str, key_id: u8, seed: u8) -> Signer {
        Signer {
            role,
            name: Some(Ident::new(name).unwrap()),
            key_id,
            key: SigningKey::from_bytes(&[seed; 32]).verifying_key(),
            may: May {
                lease: true,
                release: role == Role::Operator,
                ..May::default()
            },
        }
    }

    #[test]
    fn the_firmware_keyring_holds_the_sites_operators_and_no_one_else() {
        let ring = [
            signer(Role::Cdu, "cdu-1", 1, 1),
            signer(Role::Operator, "jdoe", 1, 2),
            signer(Role::Operator, "jdoe", 2, 3),
            signer(Role::Operator, "asmith", 1, 4),
        ];
        let text = firmware_keyring(&Ident::new("cdu-1").unwrap(), &ring).unwrap();
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(v["cdu"].as_str(), Some("cdu-1"));
        let ops = v["operator"].as_array().unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[1]["name"].as_str(), Some("jdoe"));
        assert_eq!(ops[1]["key_id"].as_integer(), Some(2));
        let public = hex(SigningKey::from_bytes(&[3; 32]).verifying_key().as_bytes());
        assert_eq!(ops[1]["public_key"].as_str(), Some(public.as_str()));
        assert!(
            !text.contains("cdu-1\"\nkey_id"),
            "no CDU among the operators"
        );
        let e = firmware_keyring(&Ident::new("cdu-1").unwrap(), &ring[..1]).unwrap_err();
        assert!(e.contains("no operator"), "{e}");
        let many: Vec<Signer> = (0..17)
            .map(|i| signer(Role::Operator, &format!("op{i}"), 1, i as u8 + 10))
            .collect();
        let e = firmware_keyring(&Ident::new("cdu-1").unwrap(), &many).unwrap_err();
        assert!(e.contains("at most 16"), "{e}");
    }

    /// An operator who may only ask for resends (a watcher) clears
    /// nothing on the firmware.
    #[test]
    fn an_operator_who_may_not_release_is_not_in_the_firmware_keyring() {
        let mut watcher = signer(Role::Operator, "noc", 1, 5);
        watcher.may = May {
            resend: true,
            ..May::default()
        };
        let cdu = Ident::new("cdu-1").unwrap();
        let e = firmware_keyring(&cdu, std::slice::from_ref(&watcher)).unwrap_err();
        assert!(e.contains("may release"), "{e}");
        let ring = [watcher, signer(Role::Operator, "jdoe", 1, 2)];
        let text = firmware_keyring(&cdu, &ring).unwrap();
        assert!(
            text.contains("\"jdoe\"") && !text.contains("\"noc\""),
            "{text}"
        );
    }
}
