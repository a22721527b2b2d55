//! The cooling properties' frames (the CDU's states, genuine and
//! hostile), the strategies that draw the operations, and the check of
//! the steps run over a whole run.

use crate::*;

/// `cdu-a`'s state (sent by `sender`) with `seq` and `stamp`, saying
/// `word` of rack 2, rack 0 lost when `other_lost`; unsigned.
pub fn state(sender: &str, seq: u32, stamp: u64, word: Word, other_lost: bool) -> Frame {
    let mut f = samples::frame(MessageKind::CduState);
    f.sender = NodeId::new(Role::Cdu, sender).unwrap();
    f.seq = seq;
    f.time = TimestampMs(stamp);
    if let Message::CduState(st) = &mut f.message {
        st.racks.clear();
        for r in 0..4u8 {
            let cooling = match (r, word) {
                (RACK, Word::Unlisted) => continue,
                (RACK, Word::Lost) => RackCooling::Lost,
                (0, _) if other_lost => RackCooling::Lost,
                _ => RackCooling::Normal,
            };
            let mut rack = samples_rack();
            rack.rack = RackIndex::new(r).unwrap();
            rack.cooling = cooling;
            st.racks.push(rack).unwrap();
        }
    }
    f
}

/// A rack's state as the samples write it.
pub fn samples_rack() -> loopwarden_protocol::RackState {
    match samples::frame(MessageKind::CduState).message {
        Message::CduState(st) => st.racks[0],
        _ => unreachable!("a CDU state"),
    }
}

pub fn cdu_b_topic() -> Topic {
    Topic::new(
        &Ident::new("hall-1").unwrap(),
        Role::Cdu,
        &Ident::new("cdu-b").unwrap(),
        Family::Health,
    )
}

pub fn signed(mut f: Frame, topic: &Topic, key_id: u8, key: &SigningKey) -> Frame {
    f.sign(topic, key_id, key).unwrap();
    f
}

/// A hostile state saying `word`, and the topic it comes on. It claims a
/// seq far above the controller's: were it taken as the last state, the
/// controller's next states would be refused as replays.
pub fn hostile(m: &Model, how: Hostile, word: Word) -> (Frame, Topic) {
    let (t, seq, key) = (m.t, m.cdu_seq + 1_000, demo_signing_key());
    let ours = cdu_topic();
    let frame = match how {
        Hostile::OtherCdu => signed(state("cdu-b", seq, t, word, false), &ours, 1, &key),
        Hostile::OtherCduTopic => {
            let f = signed(state("cdu-b", seq, t, word, false), &cdu_b_topic(), 1, &key);
            return (f, cdu_b_topic());
        }
        Hostile::Unsigned => state("cdu-a", seq, t, word, false),
        Hostile::BadSignature => {
            let mut f = signed(state("cdu-a", seq, t, word, false), &ours, 1, &key);
            if let Message::CduState(st) = &mut f.message {
                st.auth.signature[1][7] ^= 0x10;
            }
            f
        }
        Hostile::WrongKey => {
            let other = SigningKey::from_bytes(&[7; 32]);
            signed(state("cdu-a", seq, t, word, false), &ours, 1, &other)
        }
        Hostile::UnknownKeyId => signed(state("cdu-a", seq, t, word, false), &ours, 2, &key),
        Hostile::SignedForOtherTopic => {
            signed(state("cdu-a", seq, t, word, false), &cdu_b_topic(), 1, &key)
        }
        Hostile::Stale(s) => {
            let stamp = t - COMMAND_MAX_AGE_MS - 1 - u64::from(s) * 1_000;
            signed(state("cdu-a", seq, stamp, word, false), &ours, 1, &key)
        }
        Hostile::Ahead(s) => {
            let stamp = t + COMMAND_MAX_AGE_MS + 1 + u64::from(s) * 1_000;
            signed(state("cdu-a", seq, stamp, word, false), &ours, 1, &key)
        }
    };
    (frame, ours)
}

/// What a state says of rack 2.
pub fn word_of(f: &Frame) -> Word {
    let Message::CduState(st) = &f.message else {
        unreachable!("a CDU state")
    };
    match st.racks.iter().find(|r| r.rack.get() == RACK) {
        None => Word::Unlisted,
        Some(r) if r.cooling == RackCooling::Lost => Word::Lost,
        Some(_) => Word::Cooled,
    }
}

/// Properties 1 and 3 over every step run (those run again left out):
/// each loss is a drain, a power-down no sooner than the grace after it,
/// then the undo in reverse; or a drain and a resume alone.
pub fn check_losses(ran: &[(u64, CoolingStep, bool)]) -> Result<(), TestCaseError> {
    use CoolingStep::*;
    let mut drained: Option<u64> = None;
    let mut last: Option<CoolingStep> = None;
    for &(t, s, _) in ran.iter().filter(|&&(_, _, again)| !again) {
        let follows = match s {
            Drain => matches!(last, None | Some(Resume)),
            PowerDown => last == Some(Drain),
            PowerUp => last == Some(PowerDown),
            Resume => matches!(last, Some(Drain | PowerUp)),
        };
        prop_assert!(follows, "{:?} after {:?}: {:?}", s, last, ran);
        match s {
            Drain => drained = Some(t),
            PowerDown => {
                let since = drained.unwrap_or(0);
                prop_assert!(
                    t >= since + GRACE_MS,
                    "powered down {} ms after the drain",
                    t - since
                );
            }
            _ => {}
        }
        last = Some(s);
    }
    Ok(())
}

pub fn word() -> impl Strategy<Value = Word> {
    prop_oneof![4 => Just(Word::Lost), 4 => Just(Word::Cooled), 1 => Just(Word::Unlisted)]
}

pub fn hostile_how() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        Just(Hostile::OtherCdu),
        Just(Hostile::OtherCduTopic),
        Just(Hostile::Unsigned),
        Just(Hostile::BadSignature),
        Just(Hostile::WrongKey),
        Just(Hostile::UnknownKeyId),
        Just(Hostile::SignedForOtherTopic),
        (0u16..600).prop_map(Hostile::Stale),
        (0u16..600).prop_map(Hostile::Ahead),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let late_s = prop_oneof![4 => Just(0u16), 1 => 1u16..=300];
    prop_oneof![
        6 => (word(), any::<bool>(), late_s).prop_map(|(word, other_lost, late_s)| Op::State {
            word,
            other_lost,
            late_s,
        }),
        1 => (0u32..5).prop_map(Op::CounterReset),
        4 => (hostile_how(), word()).prop_map(|(how, word)| Op::Hostile { how, word }),
        3 => any::<usize>().prop_map(Op::Replay),
        5 => prop_oneof![3 => 1u16..=10, 2 => 20u16..=40, 1 => 150u16..=400].prop_map(Op::Rounds),
        1 => (0u8..GPUS as u8).prop_map(Op::Xid),
        1 => (0u8..GPUS as u8).prop_map(Op::Release),
        2 => prop_oneof![2 => 0u16..=10, 2 => 10u16..=60, 1 => 60u16..=400].prop_map(Op::Restart),
        2 => (0u8..=3, prop_oneof![2 => 0u16..=10, 1 => 10u16..=400])
            .prop_map(|(done, down_s)| Op::Crash { done, down_s }),
    ]
}

/// A loss, rounds past its grace (the power-down handed out), and a
/// crash before the power-down's outcome was kept (`done` 0; or 1, when
/// the rounds found it decided already): the power-down kept pending.
pub fn crash_in_the_power_down() -> impl Strategy<Value = Vec<Op>> {
    let grace_s = (GRACE_MS / 1_000) as u16;
    (grace_s..grace_s + 5, 0u8..=1, 0u16..=60).prop_map(|(rounds, done, down_s)| {
        vec![
            Op::State {
                word: Word::Lost,
                other_lost: false,
                late_s: 0,
            },
            Op::Rounds(rounds),
            Op::Crash { done, down_s },
        ]
    })
}
