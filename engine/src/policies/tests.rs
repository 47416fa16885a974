use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::policy::native::NativeRules;
use crate::policy::testing::HookedPolicy;

/// Fails its first `failures` calls with `error()`, then answers: key "key", a complete empty
/// selection, nothing to drop.
fn flaky(failures: u32, error: fn() -> PolicyError) -> Box<dyn CachePolicy> {
    fn answer<T>(left: &AtomicU32, error: fn() -> PolicyError, value: T) -> Result<T, PolicyError> {
        match left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
            Ok(_) => Err(error()),
            Err(_) => Ok(value),
        }
    }
    Box::new(
        HookedPolicy::new(NativeRules::new("k"), (AtomicU32::new(failures), error))
            .on_compat_key(|_, (left, error), _| answer(left, *error, "key".into()))
            .on_select(|_, (left, error), _, _| answer(left, *error, Selection::complete(vec![])))
            .on_retain(|_, (left, error), _, _, _| answer(left, *error, vec![])),
    )
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
