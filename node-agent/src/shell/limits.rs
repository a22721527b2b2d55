//! Power limits as the node asks: set each and read it back, or read
//! every GPU's as it is now, each through its worker within the deadline,
//! all GPUs at once; and each GPU's ceiling kept in flash, under the
//! GPU's UUID (an earlier version's, under its index, is found by the
//! UUID it names), before a set. What the values mean (what is in force, what to retry, what to
//! say) is the node's.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::Watts;
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::recorder::Recorder;
use node_core::node::{KeptLimit, LimitResult, Node, SetLimit};
use serde::{Deserialize, Serialize};

use super::{Agent, GpuState};

/// The config-store key of a GPU's kept limits: under its identity (its
/// UUID's hash), so a GPU renumbered (one taken off the bus, a driver
/// that counts them otherwise) finds its own; `None` when its UUID is
/// unknown.
fn limit_key(uuid: &str) -> Option<String> {
    super::identity(uuid).map(|id| format!("limit.{id:016x}"))
}

/// Where an earlier version kept a GPU's limits: under its index then.
fn index_key(gpu: usize) -> String {
    format!("limit.{gpu}")
}

/// What a GPU's limits record holds from a start that found the config
/// store lost until the GPU's first limit read since is kept (which
/// overwrites it): its kept limits read as unreadable at every start
/// meanwhile, so the limit found on it (it may be a cap a lease left in
/// force) is said as an error, never taken quietly for its ceiling. The
/// store's lost mark need not wait for a GPU whose limit never reads.
const UNREAD_SINCE_LOSS: &[u8] = b"limit unread since the config store was lost";

/// Why a GPU's limits record that holds [`UNREAD_SINCE_LOSS`] is unreadable.
fn unread_since_loss(key: &str) -> String {
    format!("{key}: no limit read from the GPU has been kept since the config store was lost")
}

/// One GPU's kept limits, with the GPU they belong to.
#[derive(Serialize, Deserialize)]
struct Kept {
    uuid: String,
    limit: KeptLimit,
}

/// The limits kept under its UUID for the GPU of `uuid` (identified
/// late), read through the recorder, which owns the store by then.
pub(super) async fn kept_through(
    recorder: &Recorder,
    uuid: &str,
) -> Result<Option<KeptLimit>, String> {
    let Some(key) = limit_key(uuid) else {
        return Ok(None);
    };
    let Some(bytes) = recorder.get(key.clone()).await? else {
        return Ok(None);
    };
    if bytes == UNREAD_SINCE_LOSS {
        return Err(unread_since_loss(&key));
    }
    let kept: Kept = postcard::from_bytes(&bytes).map_err(|e| format!("{key}: {e}"))?;
    Ok((kept.uuid == uuid).then_some(kept.limit))
}

/// The record under `key`, if one is there.
async fn read_kept(store: &mut ConfigStore<Flash>, key: &str) -> Result<Option<Kept>, String> {
    let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
    match store.get(key, &mut buf).await {
        Ok(Some(n)) if &buf[..n] == UNREAD_SINCE_LOSS => Err(unread_since_loss(key)),
        Ok(Some(n)) => postcard::from_bytes(&buf[..n])
            .map(Some)
            .map_err(|e| format!("{key}: {e}")),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("{key}: {e}")),
    }
}

/// The limits kept for the GPU of `uuid`: under its UUID, else (kept by
/// an earlier version) under whichever index they were kept for it.
async fn kept_for(store: &mut ConfigStore<Flash>, uuid: &str) -> Result<Option<KeptLimit>, String> {
    let Some(key) = limit_key(uuid) else {
        return Ok(None);
    };
    let mine = |k: Kept| (k.uuid == uuid).then_some(k.limit);
    if let Some(k) = read_kept(store, &key).await? {
        return Ok(mine(k));
    }
    for i in 0..loopwarden_protocol::MAX_GPUS {
        // An unreadable old record is another GPU's as likely as this one's.
        if let Ok(Some(limit)) = read_kept(store, &index_key(i))
            .await
            .map(|k| k.and_then(mine))
        {
            return Ok(Some(limit));
        }
    }
    Ok(None)
}

/// Gives `node` the limits kept before a restart, each only for the GPU
/// (by UUID) it was kept for: a GPU swapped since starts from what is
/// found on it. Limits that cannot be read, and none found when the
/// config store was lost since an earlier run (`config_lost`: a cap in
/// force then may be on the GPU still), are unreadable: the GPU's
/// ceiling is the limit found on it, said as an error at its first read.
/// Returns the GPUs whose kept limits are unreadable (after a loss, those
/// whose record did not survive it: a loss may be partial, and a record
/// read is taken as kept: most often the site's limit to put back at
/// exit, though it may be the limit a start since the loss first read, a
/// cap perhaps, kept while the lost mark stayed, or an older copy of the
/// key the loss left; the docs ask for each ceiling to be checked).
pub(super) async fn restore(
    node: &mut Node,
    gpus: &[GpuState],
    store: &mut ConfigStore<Flash>,
    config_lost: bool,
) -> Vec<u8> {
    let mut unreadable = Vec::new();
    for (i, g) in gpus.iter().enumerate() {
        let kept = match kept_for(store, &g.info.uuid).await {
            Ok(None) if config_lost => Err(super::startup::STORE_LOST.to_string()),
            other => other,
        };
        match kept {
            Ok(Some(limit)) => node.restore_limit(i as u8, limit),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(
                    "GPU {i}: kept power limits unreadable ({e}); its ceiling is the limit found on it, which may be a cap left in force: check it against the site's once read"
                );
                node.restore_limit_unreadable(i as u8);
                unreadable.push(i as u8);
            }
        }
    }
    unreadable
}

/// The config-store record (key, value) of the limits `limit` kept for
/// the GPU of `uuid`; `None` when its UUID is unknown (nothing is kept
/// under a guess).
pub(super) fn record(
    uuid: &str,
    limit: KeptLimit,
) -> Option<Result<(String, Vec<u8>), postcard::Error>> {
    let key = limit_key(uuid)?;
    let kept = Kept {
        uuid: uuid.to_string(),
        limit,
    };
    Some(postcard::to_allocvec(&kept).map(|bytes| (key, bytes)))
}

/// The config-store record (key, value) that reads as the limits of the
/// GPU of `uuid` not read since the config store was lost
/// ([`UNREAD_SINCE_LOSS`]), until its first limits kept overwrite it;
/// `None` when its UUID is unknown. Only for a GPU whose limits record
/// the loss took (missing or unreadable): one that survived it is kept
/// as it is.
pub(super) fn unread_record(uuid: &str) -> Option<(String, Vec<u8>)> {
    limit_key(uuid).map(|key| (key, UNREAD_SINCE_LOSS.to_vec()))
}

/// One GPU's limits record to keep: the GPU's index, its UUID, and the
/// record (key, value).
type GpuRecord = (usize, String, (String, Vec<u8>));

/// Keeps every GPU's limits `records`, handed over as one, and waits
/// until all are in flash: any one refused is said (the first refusal's
/// words), naming its GPU (the key is a hash of the UUID). Returns
/// whether all are kept.
async fn keep_records(recorder: &Recorder, records: Vec<GpuRecord>) -> bool {
    if records.is_empty() {
        return true;
    }
    let (gpus, items): (Vec<_>, Vec<_>) = records
        .into_iter()
        .map(|(i, uuid, record)| ((i, uuid, record.0.clone()), record))
        .unzip();
    match recorder.set_all_sync(items).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(
                "{}: power limits not kept in flash ({e}): a restart may take a cap it finds for the site's limit",
                refused_gpus(&gpus, &e)
            );
            false
        }
    }
}

/// The GPUs (index, UUID, key) whose record the store's refusal `e`
/// names (it begins with the key of the first it refused); all of them
/// when it names none (the store gone).
fn refused_gpus(gpus: &[(usize, String, String)], e: &str) -> String {
    let named: Vec<_> = gpus
        .iter()
        .filter(|(_, _, key)| e.starts_with(&format!("{key} ")))
        .collect();
    let said = if named.is_empty() {
        gpus.iter().collect()
    } else {
        named
    };
    let list: Vec<String> = said
        .iter()
        .map(|(i, uuid, _)| format!("{i} ({uuid})"))
        .collect();
    let gpu = if list.len() == 1 { "GPU" } else { "GPUs" };
    format!("{gpu} {}", list.join(", "))
}

impl Agent {
    /// Reads every GPU's limit as it is now, all GPUs at once: a slow
    /// GPU costs the round one deadline, not one per GPU.
    pub(super) async fn read_limits(&mut self) -> Vec<Result<Watts, String>> {
        let deadline = self.config.deadline;
        let reads = self.workers.iter().map(|w| w.read_limit(deadline));
        futures::future::join_all(reads)
            .await
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    /// Keeps every GPU's limits in flash, under its UUID, and waits until
    /// they are there (a failure is said; the limits are set anyway: a
    /// cap matters more than the record of it). A GPU whose UUID is
    /// unknown has none kept (said once); one given none (`None`: never
    /// read) keeps its record as it is: after a config store lost, the
    /// record that its limits were not read since
    /// ([`unread_record`]), which its first limits kept overwrite.
    pub(super) async fn keep_limits(&mut self, limits: Vec<Option<KeptLimit>>) {
        let mut records = Vec::new();
        let mut unknown = Vec::new();
        for (i, (limit, g)) in limits.into_iter().zip(&self.gpus).enumerate() {
            let Some(limit) = limit else {
                continue;
            };
            match record(&g.info.uuid, limit) {
                Some(Ok(r)) => records.push((i, g.info.uuid.clone(), r)),
                Some(Err(e)) => tracing::error!("GPU {i}: power limits not encodable: {e}"),
                // Its UUID is unknown: nothing is kept under a guess.
                None => unknown.push(i),
            }
        }
        if !unknown.is_empty() && !self.unkept_limits_said {
            self.unkept_limits_said = true;
            for i in unknown {
                tracing::warn!(
                    "GPU {i}: its UUID is unknown: its power limits are not kept in flash (a restart starts it from the limit found on it)"
                );
            }
        }
        keep_records(&self.recorder, records).await;
    }

    /// Sets each limit and reads it back, every GPU's at once (each
    /// through its own worker): a slow GPU holds back no other's cap.
    /// Where the node asks ([`SetLimit::read_first`]: the GPU's ceiling
    /// was never read), the limit is read just before, and a limit found
    /// below the one to set is left as it is (the set would raise it).
    pub(super) async fn set_limits(&mut self, sets: &[SetLimit]) -> Vec<LimitResult> {
        let deadline = self.config.deadline;
        let config = &self.config;
        let jobs = sets.iter().filter_map(|s| {
            let w = self.workers.get(s.gpu as usize)?;
            Some(async move {
                let mut first = None;
                if s.read_first {
                    let found = w.read_limit(deadline).await.map_err(|e| e.to_string());
                    if let Some(f) = found.as_ref().ok().copied().filter(|&f| f < s.limit) {
                        let result = LimitResult {
                            gpu: s.gpu,
                            limit: s.limit,
                            set: Err(format!("not set: {} W found on it just before", f.0)),
                            back: Ok(f),
                            first: Some(found),
                            range: None,
                        };
                        return (result, None);
                    }
                    first = Some(found);
                }
                let set = w.set_limit(s.limit, deadline).await;
                let back = w.read_limit(deadline).await;
                let (range, described) = match (&set, &back) {
                    (Ok(()), Ok(b)) if *b != s.limit => {
                        super::identify::range_now(w, deadline, config).await
                    }
                    _ => (None, None),
                };
                let result = LimitResult {
                    gpu: s.gpu,
                    limit: s.limit,
                    set: set.map_err(|e| e.to_string()),
                    back: back.map_err(|e| e.to_string()),
                    first,
                    range,
                };
                (result, described)
            })
        });
        let results = futures::future::join_all(jobs).await;
        self.took_ranges(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::Watts;

    fn limit(asked: u32) -> KeptLimit {
        KeptLimit {
            ceiling: Watts(700),
            asked: Watts(asked),
            before: None,
        }
    }

    async fn put(store: &mut ConfigStore<Flash>, key: &str, uuid: &str, asked: u32) {
        let kept = Kept {
            uuid: uuid.into(),
            limit: limit(asked),
        };
        let bytes = postcard::to_allocvec(&kept).unwrap();
        store.set(key, &bytes).await.unwrap();
    }

    /// GPU 0's record refused by the flash (a value longer than it takes),
    /// GPU 1's kept: the limits are said not kept, GPU 1's all the same.
    #[test]
    fn a_refused_record_of_any_gpu_is_said_not_only_the_last() {
        let stores = loopwarden_store::agent_flash::open(None).unwrap();
        let recorder = Recorder::start(stores.log, stores.store, None).unwrap();
        let record = |i: usize, uuid: &str| {
            let kept = Kept {
                uuid: uuid.into(),
                limit: limit(300),
            };
            let r = (
                limit_key(uuid).unwrap(),
                postcard::to_allocvec(&kept).unwrap(),
            );
            (i, uuid.to_string(), r)
        };
        let long = format!("GPU-{}", "0".repeat(loopwarden_flash::config::MAX_VALUE));
        let records = vec![record(0, &long), record(1, "GPU-bbbb")];
        let (kept, log) = crate::test_log::logged(|| {
            futures::executor::block_on(keep_records(&recorder, records))
        });
        assert!(!kept, "GPU 0's refusal unsaid");
        // Its key is a hash of the UUID: the GPU is named, not the key.
        let said: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(said.len(), 1, "{log}");
        assert!(
            said[0].contains(&format!("GPU 0 ({long}): power limits not kept in flash")),
            "{log}"
        );
        assert!(!said[0].contains("GPU 1"), "{log}");
        futures::executor::block_on(async {
            let kept = recorder.get(limit_key("GPU-bbbb").unwrap()).await;
            assert!(kept.unwrap().is_some(), "GPU 1's kept");
            assert!(keep_records(&recorder, vec![record(2, "GPU-cccc")]).await);
        });
    }

    #[test]
    fn a_gpu_finds_its_own_kept_limits_whatever_its_index() {
        let (a, b) = ("GPU-aaaa", "GPU-bbbb");
        let mut stores = loopwarden_store::agent_flash::open(None).unwrap();
        let store = &mut stores.store;
        futures::executor::block_on(async {
            // An earlier version kept them by index; the GPUs are
            // numbered the other way round now.
            put(store, &index_key(0), a, 300).await;
            put(store, &index_key(1), b, 450).await;
            assert_eq!(kept_for(store, b).await, Ok(Some(limit(450))));
            assert_eq!(kept_for(store, a).await, Ok(Some(limit(300))));
            // Kept under its UUID since: that record is the one.
            put(store, &limit_key(a).unwrap(), a, 550).await;
            assert_eq!(kept_for(store, a).await, Ok(Some(limit(550))));
            assert_eq!(kept_for(store, "GPU-cccc").await, Ok(None));
            assert_eq!(kept_for(store, "unknown").await, Ok(None));
        });
    }
}
