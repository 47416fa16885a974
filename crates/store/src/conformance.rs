//! The store contract as executable checks. Every backend runs `run_all` (the local store in its
//! unit tests, Mooncake against a real cluster in the end-to-end tests). Each check uses keys under
//! its own `prefix` so runs do not collide; a failure says which promise was broken.

use super::{Store, StoreError, ValueClass};

type Check = fn(&dyn Store, &str) -> Result<(), String>;

/// All checks, by name.
pub const CHECKS: &[(&str, Check)] = &[
    (
        "put_then_get_returns_the_value",
        put_then_get_returns_the_value,
    ),
    (
        "missing_key_is_a_miss_not_an_error",
        missing_key_is_a_miss_not_an_error,
    ),
    (
        "put_on_existing_key_keeps_the_old_value",
        put_on_existing_key_keeps_the_old_value,
    ),
    ("remove_then_get_misses", remove_then_get_misses),
    (
        "batches_answer_per_key_in_order",
        batches_answer_per_key_in_order,
    ),
    ("large_values_round_trip", large_values_round_trip),
    (
        "list_finds_keys_by_prefix_if_supported",
        list_finds_keys_by_prefix_if_supported,
    ),
    (
        "concurrent_puts_of_one_key_keep_one_value",
        concurrent_puts_of_one_key_keep_one_value,
    ),
    (
        "sized_batches_answer_per_key_whatever_the_hint",
        sized_batches_answer_per_key_whatever_the_hint,
    ),
    (
        "capped_gets_refuse_values_over_the_cap",
        capped_gets_refuse_values_over_the_cap,
    ),
];

/// Runs every check; returns the failures joined, if any.
pub fn run_all(store: &dyn Store, prefix: &str) -> Result<(), String> {
    let failures: Vec<String> = CHECKS
        .iter()
        .filter_map(|(name, check)| {
            check(store, &format!("{prefix}/{name}"))
                .err()
                .map(|e| format!("{name}: {e}"))
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(msg()) }
}

fn e(err: StoreError) -> String {
    err.to_string()
}

fn put_then_get_returns_the_value(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/k");
    s.put(&key, b"value-1", ValueClass::Bulk).map_err(e)?;
    let got = s.get(&key).map_err(e)?;
    ensure(got.as_deref() == Some(&b"value-1"[..]), || {
        format!("got {got:?}")
    })?;
    ensure(s.exists(&key).map_err(e)?, || {
        "exists() says false after put".into()
    })
}

fn missing_key_is_a_miss_not_an_error(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/never-written");
    ensure(s.get(&key).map_err(e)?.is_none(), || {
        "get of a missing key returned a value".into()
    })?;
    ensure(!s.exists(&key).map_err(e)?, || {
        "exists() of a missing key said true".into()
    })?;
    ensure(!s.remove(&key).map_err(e)?, || {
        "remove() of a missing key said it removed something".into()
    })
}

fn put_on_existing_key_keeps_the_old_value(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/k");
    s.put(&key, b"first", ValueClass::Bulk).map_err(e)?;
    s.put(&key, b"second, longer", ValueClass::Bulk)
        .map_err(|err| format!("second put must succeed, got {err}"))?;
    let got = s.get(&key).map_err(e)?;
    ensure(got.as_deref() == Some(&b"first"[..]), || {
        format!("the old value must stay, got {got:?}")
    })
}

fn remove_then_get_misses(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/k");
    s.put(&key, b"v", ValueClass::Bulk).map_err(e)?;
    ensure(s.remove(&key).map_err(e)?, || {
        "remove() of a present key said false".into()
    })?;
    ensure(s.get(&key).map_err(e)?.is_none(), || {
        "get after remove returned a value".into()
    })?;
    s.put(&key, b"again", ValueClass::Bulk).map_err(e)?;
    let got = s.get(&key).map_err(e)?;
    ensure(got.as_deref() == Some(&b"again"[..]), || {
        format!("a removed key can be written again, got {got:?}")
    })
}

fn batches_answer_per_key_in_order(s: &dyn Store, p: &str) -> Result<(), String> {
    let keys: Vec<String> = (0..5).map(|i| format!("{p}/k{i}")).collect();
    let values: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 100 + i]).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&values)
        .take(4)
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    for r in s.put_batch(&items, ValueClass::Bulk) {
        r.map_err(e)?;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = s.get_batch(&refs);
    ensure(got.len() == 5, || {
        format!("{} results for 5 keys", got.len())
    })?;
    for (i, r) in got.into_iter().enumerate() {
        let v = r.map_err(e)?;
        let want = if i < 4 { Some(values[i].clone()) } else { None };
        ensure(v == want, || {
            format!("key {i}: wrong value or hit for a missing key")
        })?;
    }
    let ex: Vec<bool> = s
        .exists_batch(&refs)
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(e)?;
    ensure(ex == vec![true, true, true, true, false], || {
        format!("exists_batch said {ex:?}")
    })
}

/// `get_sized_batch`: values in order, a miss for a missing key, and the true value when the
/// expected size is wrong (smaller, larger) or beyond what the store moves; the values of one
/// batch stay valid together (on Mooncake they share one staging buffer).
fn sized_batches_answer_per_key_whatever_the_hint(s: &dyn Store, p: &str) -> Result<(), String> {
    let sizes = [5000usize, 1, 70_000, 4096, 300];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("{p}/s{i}")).collect();
    let values: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (i * 7 + j % 251) as u8).collect())
        .collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    for r in s.put_batch(&items, ValueClass::Bulk) {
        r.map_err(e)?;
    }
    let missing = format!("{p}/missing");
    let hints: Vec<(&str, u64)> = vec![
        (keys[0].as_str(), 5000),
        (keys[1].as_str(), 1),
        (keys[2].as_str(), 1000),
        (missing.as_str(), 64),
        (keys[3].as_str(), 8192),
        (keys[4].as_str(), s.max_value_size() + 1),
    ];
    let want: Vec<Option<&[u8]>> = vec![
        Some(&values[0]),
        Some(&values[1]),
        Some(&values[2]),
        None,
        Some(&values[3]),
        Some(&values[4]),
    ];
    let got = s.get_sized_batch(&hints);
    ensure(got.len() == hints.len(), || {
        format!("{} results for {} keys", got.len(), hints.len())
    })?;
    let got: Vec<_> = got.into_iter().collect::<Result<_, _>>().map_err(e)?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ensure(g.as_deref() == *w, || {
            format!(
                "key {i} (hint {}): got {:?} bytes, want {:?}",
                hints[i].1,
                g.as_ref().map(|v| v.len()),
                w.map(<[u8]>::len)
            )
        })?;
    }
    Ok(())
}

fn large_values_round_trip(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/big");
    let size = (8 * 1024 * 1024).min(s.max_value_size()) as usize;
    let value: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    s.put(&key, &value, ValueClass::Bulk).map_err(e)?;
    let got = s
        .get(&key)
        .map_err(e)?
        .ok_or("large value missing after put")?;
    ensure(got == value, || "large value came back different".into())
}

/// Listing works exactly when `capabilities()` says so; records and bulk values list alike.
fn list_finds_keys_by_prefix_if_supported(s: &dyn Store, p: &str) -> Result<(), String> {
    s.put(&format!("{p}/a/1"), b"x", ValueClass::Record)
        .map_err(e)?;
    s.put(&format!("{p}/a/2"), b"x", ValueClass::Bulk)
        .map_err(e)?;
    s.put(&format!("{p}/b/1"), b"x", ValueClass::Bulk)
        .map_err(e)?;
    let listing = s.capabilities().listing;
    match s.list(&format!("{p}/a/")) {
        Err(StoreError::Unsupported(_)) if !listing => Ok(()),
        Err(StoreError::Unsupported(_)) => {
            Err("capabilities() says listing works, list() says unsupported".into())
        }
        Err(err) => Err(e(err)),
        Ok(_) if !listing => {
            Err("list() answered though capabilities() says listing is unsupported".into())
        }
        Ok(mut keys) => {
            keys.sort();
            ensure(keys == vec![format!("{p}/a/1"), format!("{p}/a/2")], || {
                format!("listed {keys:?}")
            })
        }
    }
}

fn concurrent_puts_of_one_key_keep_one_value(s: &dyn Store, p: &str) -> Result<(), String> {
    let key = format!("{p}/race");
    let values: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 4096]).collect();
    std::thread::scope(|scope| {
        for v in &values {
            let key = &key;
            scope.spawn(move || s.put(key, v, ValueClass::Bulk));
        }
    });
    let got = s.get(&key).map_err(e)?.ok_or("raced key missing")?;
    ensure(values.contains(&got), || {
        "raced key holds a mix of values".into()
    })
}

/// `get_capped`: a value at the cap is returned, one over it is `TooLarge` (with its size), a
/// missing key is a miss: what every record read of a store others write to relies on.
fn capped_gets_refuse_values_over_the_cap(s: &dyn Store, p: &str) -> Result<(), String> {
    let cap = 64 << 10;
    let (at, over, missing) = (
        format!("{p}/at"),
        format!("{p}/over"),
        format!("{p}/missing"),
    );
    let at_cap = vec![3u8; cap];
    let over_cap = vec![4u8; 1 << 20];
    s.put(&at, &at_cap, ValueClass::Record).map_err(e)?;
    s.put(&over, &over_cap, ValueClass::Record).map_err(e)?;
    let got = s.get_capped(&at, cap as u64).map_err(e)?;
    ensure(got.as_deref() == Some(&at_cap[..]), || {
        format!(
            "a value at the cap came back as {:?} bytes",
            got.map(|v| v.len())
        )
    })?;
    match s.get_capped(&over, cap as u64) {
        Err(StoreError::TooLarge { size, limit }) => {
            ensure(size == over_cap.len() as u64 && limit == cap as u64, || {
                format!("TooLarge says {size} over {limit}")
            })?
        }
        other => {
            return Err(format!(
                "a value over the cap: {:?}, not TooLarge",
                other.map(|v| v.map(|v| v.len()))
            ));
        }
    }
    let got = s.get_capped(&missing, cap as u64).map_err(e)?;
    ensure(got.is_none(), || "a missing key is not a miss".into())?;
    // The uncapped get still returns it whole.
    let got = s.get(&over).map_err(e)?;
    ensure(got.as_deref() == Some(&over_cap[..]), || {
        "get after a refused capped get".into()
    })
}
