use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Fails its first `failures` calls with `error()`, then answers.
struct Flaky {
    info: PolicyInfo,
    failures: AtomicU32,
    error: fn() -> PolicyError,
}

fn flaky(failures: u32, error: fn() -> PolicyError) -> Box<dyn CachePolicy> {
    Box::new(Flaky {
        info: PolicyInfo {
            name: "flaky".into(),
            version: "1".into(),
            cache_kind: "k".into(),
            default_root: String::new(),
            root_env: vec![],
            description: String::new(),
            settings: vec![],
        },
        failures: AtomicU32::new(failures),
        error,
    })
}

impl Flaky {
    fn answer<T>(&self, value: T) -> Result<T, PolicyError> {
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err((self.error)());
        }
        Ok(value)
    }
}

impl CachePolicy for Flaky {
    fn info(&self) -> &PolicyInfo {
        &self.info
    }
    fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            name: "flaky".into(),
            version: "1".into(),
            digest: "test".into(),
            settings: Default::default(),
        }
    }
    fn compat_key(&self, _: &Facts) -> Result<String, PolicyError> {
        self.answer("key".into())
    }
    fn select(&self, _: &Path, _: &[FileEntry]) -> Result<Selection, PolicyError> {
        self.answer(Selection::complete(vec![]))
    }
    fn retain(
        &self,
        _: &[GenerationSummary],
        _: u64,
        _: &RetentionLimits,
    ) -> Result<Vec<crate::policy::RetentionDrop>, PolicyError> {
        self.answer(vec![])
    }
}

fn wall() -> PolicyError {
    PolicyError::WallTimeExceeded { deadline_ms: 50 }
}

fn trap() -> PolicyError {
    PolicyError::Trapped("unreachable".into())
}

#[test]
fn a_slow_call_is_retried_in_place() {
    let p = GuardedPolicy::new("k", flaky(2, wall));
    assert_eq!(p.compat_key(&Facts::new()).unwrap(), "key");
    assert!(p.paused().is_none());
}

#[test]
fn slow_on_every_attempt_pauses_the_kind_then_reenables_it() {
    let p = GuardedPolicy::new("k", flaky(3, wall));
    assert!(matches!(
        p.compat_key(&Facts::new()),
        Err(PolicyError::WallTimeExceeded { .. })
    ));
    let (cause, reason) = p.paused().expect("paused after the retries");
    assert_eq!(cause, DisabledCause::Backoff);
    assert!(reason.contains("wall-clock deadline"), "{reason}");
    assert!(p.disabled_reason().is_none(), "a pause is not for good");
    // Refused during the pause, without calling the policy.
    assert!(matches!(
        p.compat_key(&Facts::new()),
        Err(PolicyError::Disabled { .. })
    ));
    // The pause passes: the next call runs, succeeds and re-enables the kind.
    if let Health::Backoff { until, .. } = &mut *p.health() {
        *until = Instant::now();
    }
    assert_eq!(p.compat_key(&Facts::new()).unwrap(), "key");
    assert!(p.paused().is_none());
}

#[test]
fn a_contract_violation_disables_for_good() {
    let p = GuardedPolicy::new("k", flaky(1, trap));
    assert!(matches!(
        p.select(Path::new("/"), &[]),
        Err(PolicyError::Trapped(_))
    ));
    assert_eq!(p.paused().unwrap().0, DisabledCause::Violation);
    // The policy would answer now; the kind stays disabled.
    assert!(matches!(
        p.compat_key(&Facts::new()),
        Err(PolicyError::Disabled { .. })
    ));
    assert!(p.disabled_reason().unwrap().contains("failed in select"));
}

#[test]
fn status_says_which_kinds_are_disabled_and_why() {
    let set = PolicySet::from_policies([
        ("slow".to_owned(), flaky(3, wall)),
        ("broken".to_owned(), flaky(1, trap)),
        ("fine".to_owned(), flaky(0, trap)),
    ]);
    for kind in ["slow", "broken", "fine"] {
        let _ = set.policy(kind).compat_key(&Facts::new());
    }
    let status: BTreeMap<_, _> = set
        .status()
        .into_iter()
        .map(|s| (s.kind.clone(), s))
        .collect();
    assert_eq!(status["slow"].disabled_cause, Some(DisabledCause::Backoff));
    assert_eq!(
        status["broken"].disabled_cause,
        Some(DisabledCause::Violation)
    );
    assert!(
        status["broken"]
            .disabled
            .as_ref()
            .unwrap()
            .contains("crashed")
    );
    assert_eq!(status["fine"].disabled_cause, None);
    // A paused kind is still handed out (it re-enables itself); a violated one is a stand-in.
    assert!(set.get("slow").is_ok());
    assert!(set.get("broken").is_err());
}
