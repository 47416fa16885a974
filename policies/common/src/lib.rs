//! Layout rules shared by jitship's built-in policies (docs/jit-caches.md):
//! Triton kernel directories and their `__grp__` group files ([`triton`]), TorchInductor trees
//! ([`inductor`]), and completeness checks on single files ([`check`]).
//!
//! Everything here reads file bytes only through [`Host`] and never panics on their content.

pub mod check;
pub mod compile_cache;
pub mod inductor;
pub mod testing;
pub mod triton;

use jitship_policy_sdk::{Decision, FileEntry, never_publish};

/// Decisions being filled in by several rules; the first rule to decide an entry wins.
pub struct Decisions {
    slots: Vec<Option<Decision>>,
}

impl Decisions {
    pub fn new(len: usize) -> Self {
        Self {
            slots: vec![None; len],
        }
    }

    /// Skips every entry no cache kind may publish (temp, lock, per-host files).
    pub fn with_never_publish(entries: &[FileEntry]) -> Self {
        let mut d = Self::new(entries.len());
        for (i, e) in entries.iter().enumerate() {
            if let Some(skip) = never_publish(&e.path) {
                d.set(i, skip);
            }
        }
        d
    }

    pub fn is_decided(&self, i: usize) -> bool {
        self.slots.get(i).is_some_and(Option::is_some)
    }

    pub fn set(&mut self, i: usize, d: Decision) {
        if let Some(slot) = self.slots.get_mut(i)
            && slot.is_none()
        {
            *slot = Some(d);
        }
    }

    /// Entries no rule decided get `fallback`.
    pub fn finish(self, fallback: impl Fn() -> Decision) -> Vec<Decision> {
        self.slots
            .into_iter()
            .map(|d| d.unwrap_or_else(&fallback))
            .collect()
    }
}

/// Path components of a relative path.
pub fn parts(path: &str) -> Vec<&str> {
    path.split('/').collect()
}
