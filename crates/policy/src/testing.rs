//! A policy that does what a test makes it do, as the store's `testing::Hooked` does for stores:
//! `compat_key`, `select`, `canonicalize`, `materialize` and `retain` run the hook set for them
//! (given `inner` to forward to, and the test's `state`), or go to `inner`. `info` and
//! `policy_ref` are always `inner`'s. The one policy double of the workspace's tests.

use std::path::Path;

use jitship_facts::Facts;
use jitship_generation::{PolicyRef, RelPath};

use crate::native::NativeRules;
use crate::{
    CachePolicy, FileEntry, GenerationSummary, PolicyError, PolicyInfo, RetentionDrop,
    RetentionLimits, Selection,
};

type KeyHook<P, T> = Box<dyn Fn(&P, &T, &Facts) -> Result<String, PolicyError> + Send + Sync>;
type SelectHook<P, T> =
    Box<dyn Fn(&P, &T, &Path, &[FileEntry]) -> Result<Selection, PolicyError> + Send + Sync>;
type RewriteHook<P, T> =
    Box<dyn Fn(&P, &T, &Path, &RelPath, &[u8]) -> Result<Vec<u8>, PolicyError> + Send + Sync>;
type RetainHook<P, T> = Box<
    dyn Fn(
            &P,
            &T,
            &[GenerationSummary],
            u64,
            &RetentionLimits,
        ) -> Result<Vec<RetentionDrop>, PolicyError>
        + Send
        + Sync,
>;

pub struct HookedPolicy<P = NativeRules, T = ()> {
    pub inner: P,
    pub state: T,
    compat_key: Option<KeyHook<P, T>>,
    select: Option<SelectHook<P, T>>,
    canonicalize: Option<RewriteHook<P, T>>,
    materialize: Option<RewriteHook<P, T>>,
    retain: Option<RetainHook<P, T>>,
}

impl<P: CachePolicy, T> HookedPolicy<P, T> {
    pub fn new(inner: P, state: T) -> Self {
        Self {
            inner,
            state,
            compat_key: None,
            select: None,
            canonicalize: None,
            materialize: None,
            retain: None,
        }
    }

    pub fn on_compat_key(
        mut self,
        hook: impl Fn(&P, &T, &Facts) -> Result<String, PolicyError> + Send + Sync + 'static,
    ) -> Self {
        self.compat_key = Some(Box::new(hook));
        self
    }

    pub fn on_select(
        mut self,
        hook: impl Fn(&P, &T, &Path, &[FileEntry]) -> Result<Selection, PolicyError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.select = Some(Box::new(hook));
        self
    }

    pub fn on_canonicalize(
        mut self,
        hook: impl Fn(&P, &T, &Path, &RelPath, &[u8]) -> Result<Vec<u8>, PolicyError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.canonicalize = Some(Box::new(hook));
        self
    }

    pub fn on_materialize(
        mut self,
        hook: impl Fn(&P, &T, &Path, &RelPath, &[u8]) -> Result<Vec<u8>, PolicyError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.materialize = Some(Box::new(hook));
        self
    }

    pub fn on_retain(
        mut self,
        hook: impl Fn(
            &P,
            &T,
            &[GenerationSummary],
            u64,
            &RetentionLimits,
        ) -> Result<Vec<RetentionDrop>, PolicyError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.retain = Some(Box::new(hook));
        self
    }
}

impl<P: CachePolicy, T: Send + Sync> CachePolicy for HookedPolicy<P, T> {
    fn info(&self) -> &PolicyInfo {
        self.inner.info()
    }
    fn policy_ref(&self) -> PolicyRef {
        self.inner.policy_ref()
    }
    fn module(&self) -> Option<std::sync::Arc<[u8]>> {
        self.inner.module()
    }
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        match &self.compat_key {
            Some(hook) => hook(&self.inner, &self.state, facts),
            None => self.inner.compat_key(facts),
        }
    }
    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
        match &self.select {
            Some(hook) => hook(&self.inner, &self.state, root, entries),
            None => self.inner.select(root, entries),
        }
    }
    fn canonicalize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        match &self.canonicalize {
            Some(hook) => hook(&self.inner, &self.state, root, path, content),
            None => self.inner.canonicalize(root, path, content),
        }
    }
    fn materialize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        match &self.materialize {
            Some(hook) => hook(&self.inner, &self.state, root, path, content),
            None => self.inner.materialize(root, path, content),
        }
    }
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        match &self.retain {
            Some(hook) => hook(&self.inner, &self.state, generations, now, limits),
            None => self.inner.retain(generations, now, limits),
        }
    }
}
