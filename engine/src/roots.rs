//! Where a cache root is when the operator names only its kind (`--cache inductor`, a `[[cache]]`
//! without `root`): resolved the way the engine resolves it, so that a sidecar given the engine's
//! environment watches the directory the engine writes.
//!
//! Each policy's `info()` says how: `root_env`, variables that move the root, highest precedence
//! first (`NAME` or `NAME/sub/path`), then `default_root`, which may start with `~/` (the home
//! directory) or `$TMPDIR/` and may contain `${USER}`. They expand as Python expands them, since
//! every engine jitship ships a policy for is a Python library:
//!
//! | token | value, first that applies |
//! |---|---|
//! | `~` | `$HOME`, else the passwd entry's home directory (`os.path.expanduser`) |
//! | `$TMPDIR` | `$TMPDIR`, `$TEMP`, `$TMP`, else `/tmp` (`tempfile.gettempdir()`; unlike Python, jitship does not probe whether the directory is writable, because the engine may run as another user) |
//! | `${USER}` | `$LOGNAME`, `$USER`, `$LNAME`, `$USERNAME`, else the passwd entry's name (`getpass.getuser()`), else `uid_<uid>` as torch does; `\/:*?"<>|` become `_` as torch sanitizes it |
//!
//! The process environment is read in one place, [`ProcessEnv::from_process`] (invariant 7);
//! everything else takes a [`ProcessEnv`], so tests give theirs explicitly. A relative result is
//! refused: the engine would resolve it against its own working directory, which jitship cannot
//! know.
//!
//! Whose root it is, once resolved, is `owner`'s question (install and publish ask it).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::CacheConfig;
use crate::policies::PolicySet;
use crate::policy::{CachePolicy, PolicyInfo};

/// The environment root resolution reads: variables and the user's passwd entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessEnv {
    vars: BTreeMap<String, String>,
    /// The passwd entry of the user jitship runs as: (name, home directory).
    account: Option<(String, PathBuf)>,
    uid: u32,
}

/// Where a resolved root came from, shown by `facts`, `publish` and `install`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "from")]
pub enum RootOrigin {
    /// Given by the operator: `--cache KIND=ROOT`, `JITSHIP_CACHES` or `root` in a `[[cache]]`.
    Given,
    /// One of the policy's `root_env` entries, e.g. `TRITON_HOME/.triton/cache`.
    Env { entry: String, value: String },
    /// The policy's `default_root`, with what each token expanded to and where that came from.
    Default {
        template: String,
        expanded: Vec<Expansion>,
    },
}

/// One token of a `default_root` and its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Expansion {
    pub token: String,
    pub value: String,
    /// `$HOME`, `passwd`, `default`, ...
    pub source: String,
}

impl fmt::Display for RootOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootOrigin::Given => f.write_str("given (--cache, JITSHIP_CACHES or [[cache]] root)"),
            RootOrigin::Env { entry, value } => {
                let var = entry.split_once('/').map_or(entry.as_str(), |(v, _)| v);
                write!(f, "${entry}, {var}={value}")
            }
            RootOrigin::Default { template, expanded } => {
                write!(f, "default {template}")?;
                for (i, e) in expanded.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { ", " };
                    write!(f, "{sep}{}={} ({})", e.token, e.value, e.source)?;
                }
                Ok(())
            }
        }
    }
}

/// A root that cannot be resolved, and what to do about it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "cannot resolve the root of cache kind {kind}: {reason}; give it as --cache {kind}=ROOT or `root` in its [[cache]]"
)]
pub struct RootError {
    pub kind: String,
    pub reason: String,
}

impl ProcessEnv {
    /// This process's environment and passwd entry: the one place root resolution reads them.
    pub fn from_process() -> Self {
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let uid = rustix::process::getuid().as_raw();
        Self {
            vars,
            account: crate::owner::passwd_entry(uid),
            uid,
        }
    }

    /// An explicit environment (tests, or the settings of another container).
    pub fn new(
        vars: impl IntoIterator<Item = (String, String)>,
        account: Option<(String, PathBuf)>,
        uid: u32,
    ) -> Self {
        Self {
            vars: vars.into_iter().collect(),
            account,
            uid,
        }
    }

    /// Sets `name` unless it is present (even empty), as Python's `os.environ.setdefault`: how
    /// an engine's own process moves its caches (`crate::engines::engine_env`).
    pub fn set_default(&mut self, name: &str, value: String) {
        self.vars.entry(name.to_owned()).or_insert(value);
    }

    /// Sets `name`, as Python's `os.environ[name] = value`.
    pub fn set(&mut self, name: &str, value: String) {
        self.vars.insert(name.to_owned(), value);
    }

    /// `os.path.expanduser(path)` for a leading `~/` (else `path` as it is); `None` when `~`
    /// cannot be expanded.
    pub fn expand_user(&self, path: &str) -> Option<String> {
        match path.strip_prefix("~/") {
            Some(rest) => Some(format!(
                "{}/{rest}",
                self.home()?.value.trim_end_matches('/')
            )),
            None if path == "~" => Some(self.home()?.value),
            None => Some(path.to_owned()),
        }
    }

    /// Whether `name` is in the environment, even empty (Python's `name in os.environ`).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    /// A variable's value; an empty one counts as unset.
    pub(crate) fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn first_var(&self, names: &[&str]) -> Option<(String, &str)> {
        names
            .iter()
            .find_map(|n| self.var(n).map(|v| (format!("${n}"), v)))
    }

    /// `os.path.expanduser("~")`.
    fn home(&self) -> Option<Expansion> {
        let (value, source) = match (self.var("HOME"), &self.account) {
            (Some(h), _) => (h.to_string(), "$HOME".to_string()),
            (None, Some((_, home))) => (home.display().to_string(), "passwd".to_string()),
            (None, None) => return None,
        };
        Some(Expansion {
            token: "~".into(),
            value,
            source,
        })
    }

    /// `tempfile.gettempdir()`, without its writability probe.
    fn tmpdir(&self) -> Expansion {
        let (value, source) = match self.first_var(&["TMPDIR", "TEMP", "TMP"]) {
            Some((source, v)) => (v.to_string(), source),
            None => ("/tmp".to_string(), "default".to_string()),
        };
        Expansion {
            token: "$TMPDIR".into(),
            value,
            source,
        }
    }

    /// `getpass.getuser()`, with torch's `uid_<n>` fallback and its sanitizing.
    fn user(&self) -> Expansion {
        let (name, source) = match self.first_var(&["LOGNAME", "USER", "LNAME", "USERNAME"]) {
            Some((source, v)) => (v.to_string(), source),
            None => match &self.account {
                Some((name, _)) => (name.clone(), "passwd".to_string()),
                None => (format!("uid_{}", self.uid), "no user name: uid".to_string()),
            },
        };
        let value = name
            .chars()
            .map(|c| if "\\/:*?\"<>|".contains(c) { '_' } else { c })
            .collect();
        Expansion {
            token: "${USER}".into(),
            value,
            source,
        }
    }
}

/// The root a policy's engine would use in `env`, and where it came from.
pub fn resolve(info: &PolicyInfo, env: &ProcessEnv) -> Result<(PathBuf, RootOrigin), RootError> {
    let fail = |reason: String| RootError {
        kind: info.cache_kind.clone(),
        reason,
    };
    for entry in &info.root_env {
        let (var, sub) = entry.split_once('/').unwrap_or((entry, ""));
        if let Some(value) = env.var(var) {
            let path = if sub.is_empty() {
                PathBuf::from(value)
            } else {
                Path::new(value).join(sub)
            };
            if path.is_relative() {
                return Err(fail(format!(
                    "{var}={value:?} is relative (the engine resolves it against its own working directory)"
                )));
            }
            let origin = RootOrigin::Env {
                entry: entry.clone(),
                value: value.to_string(),
            };
            return Ok((path, origin));
        }
    }
    let template = info.default_root.as_str();
    if template.is_empty() {
        return Err(fail(format!(
            "its policy {} names no default root",
            info.name
        )));
    }
    let mut expanded = Vec::new();
    let rest = if let Some(rest) = template.strip_prefix("~/") {
        let home = env.home().ok_or_else(|| {
            fail("~ needs $HOME or a passwd entry for this user, and neither exists".into())
        })?;
        let path = format!("{}/{rest}", home.value.trim_end_matches('/'));
        expanded.push(home);
        path
    } else if let Some(rest) = template.strip_prefix("$TMPDIR/") {
        let tmp = env.tmpdir();
        let path = format!("{}/{rest}", tmp.value.trim_end_matches('/'));
        expanded.push(tmp);
        path
    } else {
        template.to_string()
    };
    let path = if rest.contains("${USER}") {
        let user = env.user();
        let path = rest.replace("${USER}", &user.value);
        expanded.push(user);
        path
    } else {
        rest
    };
    if path.contains('$') || path.starts_with('~') {
        return Err(fail(format!(
            "its default root {template:?} uses a token jitship does not know (only ~/, $TMPDIR/ and ${{USER}})"
        )));
    }
    if Path::new(&path).is_relative() {
        return Err(fail(format!(
            "its default root expands to the relative path {path:?}"
        )));
    }
    Ok((
        PathBuf::from(path),
        RootOrigin::Default {
            template: template.to_string(),
            expanded,
        },
    ))
}

/// Fills in the root of every cache given without one, from its policy in `policies`, and says
/// where each root came from (in the order of `caches`).
pub fn resolve_cache_roots(
    caches: &mut [CacheConfig],
    policies: &PolicySet,
    env: &ProcessEnv,
) -> Result<Vec<RootOrigin>, RootError> {
    caches
        .iter_mut()
        .map(|cache| {
            if !cache.root_is_default() {
                return Ok(RootOrigin::Given);
            }
            let policy = policies.get(&cache.kind).map_err(|e| RootError {
                kind: cache.kind.clone(),
                reason: format!("its policy is unavailable ({e})"),
            })?;
            let (root, origin) = resolve(policy.info(), env)?;
            cache.root = root;
            Ok(origin)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::native::NativeRules;

    fn info(kind: &str, default_root: &str, root_env: &[&str]) -> PolicyInfo {
        PolicyInfo {
            name: kind.into(),
            version: "1".into(),
            cache_kind: kind.into(),
            default_root: default_root.into(),
            root_env: root_env.iter().map(|s| s.to_string()).collect(),
            description: String::new(),
            settings: vec![],
        }
    }

    fn env(vars: &[(&str, &str)], account: Option<(&str, &str)>) -> ProcessEnv {
        ProcessEnv::new(
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            account.map(|(n, h)| (n.to_string(), PathBuf::from(h))),
            4242,
        )
    }

    fn root(i: &PolicyInfo, e: &ProcessEnv) -> String {
        resolve(i, e).unwrap().0.display().to_string()
    }

    /// Inductor: TORCHINDUCTOR_CACHE_DIR, else $TMPDIR/torchinductor_${USER}, with each step of
    /// tempfile.gettempdir() and getpass.getuser() in Python's order.
    #[test]
    fn inductor_root_follows_each_precedence_step() {
        let i = info(
            "inductor",
            "$TMPDIR/torchinductor_${USER}",
            &["TORCHINDUCTOR_CACHE_DIR"],
        );
        let full = [
            ("TORCHINDUCTOR_CACHE_DIR", "/c/ind"),
            ("TMPDIR", "/t1"),
            ("TEMP", "/t2"),
            ("TMP", "/t3"),
            ("LOGNAME", "logname"),
            ("USER", "user"),
            ("LNAME", "lname"),
            ("USERNAME", "username"),
        ];
        let account = Some(("pw", "/home/pw"));
        let mut vars = full.to_vec();
        let (path, origin) = resolve(&i, &env(&vars, account)).unwrap();
        assert_eq!(path, Path::new("/c/ind"));
        assert_eq!(
            origin.to_string(),
            "$TORCHINDUCTOR_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR=/c/ind"
        );
        // An empty variable counts as unset, as in Python's `os.environ.get(...) or ...` checks.
        vars[0].1 = "";
        assert_eq!(root(&i, &env(&vars, account)), "/t1/torchinductor_logname");
        let expected = [
            "/t1/torchinductor_logname",
            "/t2/torchinductor_logname",
            "/t3/torchinductor_logname",
            "/tmp/torchinductor_logname",
        ];
        for (drop, want) in ["", "TMPDIR", "TEMP", "TMP"].iter().zip(expected) {
            vars.retain(|(k, _)| k != drop);
            assert_eq!(root(&i, &env(&vars, account)), want, "without {drop}");
        }
        let expected = [
            "/tmp/torchinductor_user",
            "/tmp/torchinductor_lname",
            "/tmp/torchinductor_username",
            "/tmp/torchinductor_pw",
        ];
        for (drop, want) in ["LOGNAME", "USER", "LNAME", "USERNAME"]
            .iter()
            .zip(expected)
        {
            vars.retain(|(k, _)| k != drop);
            assert_eq!(root(&i, &env(&vars, account)), want, "without {drop}");
        }
        let (path, origin) = resolve(&i, &env(&[], None)).unwrap();
        assert_eq!(path, Path::new("/tmp/torchinductor_uid_4242"));
        assert_eq!(
            origin.to_string(),
            "default $TMPDIR/torchinductor_${USER}: $TMPDIR=/tmp (default), ${USER}=uid_4242 (no user name: uid)"
        );
        // torch's sanitizing of the user name.
        assert_eq!(
            root(&i, &env(&[("USER", "dom\\a/b:c")], None)),
            "/tmp/torchinductor_dom_a_b_c"
        );
    }

    /// Triton: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache with ~
    /// from $HOME, else the passwd entry.
    #[test]
    fn triton_root_follows_each_precedence_step() {
        let i = info(
            "triton",
            "~/.triton/cache",
            &["TRITON_CACHE_DIR", "TRITON_HOME/.triton/cache"],
        );
        let account = Some(("pw", "/home/pw"));
        let mut vars = vec![
            ("TRITON_CACHE_DIR", "/c/triton"),
            ("TRITON_HOME", "/th"),
            ("HOME", "/home/env"),
        ];
        assert_eq!(root(&i, &env(&vars, account)), "/c/triton");
        vars.remove(0);
        let (path, origin) = resolve(&i, &env(&vars, account)).unwrap();
        assert_eq!(path, Path::new("/th/.triton/cache"));
        assert_eq!(
            origin.to_string(),
            "$TRITON_HOME/.triton/cache, TRITON_HOME=/th"
        );
        vars.remove(0);
        assert_eq!(root(&i, &env(&vars, account)), "/home/env/.triton/cache");
        vars.remove(0);
        assert_eq!(root(&i, &env(&vars, account)), "/home/pw/.triton/cache");
        let err = resolve(&i, &env(&[], None)).unwrap_err().to_string();
        assert!(
            err.contains("HOME") && err.contains("--cache triton=ROOT"),
            "{err}"
        );
        let err = resolve(&i, &env(&[("TRITON_CACHE_DIR", "rel/dir")], account))
            .unwrap_err()
            .to_string();
        assert!(err.contains("relative"), "{err}");
    }

    /// Every built-in policy names a root that resolves, from its first `root_env` entry when set
    /// and from its default otherwise; the native rules name none and say so.
    #[test]
    fn every_builtin_kind_resolves_its_root_from_the_environment() {
        let config = crate::config::Config {
            caches: crate::policy::builtin::kinds()
                .map(|k| crate::config::CacheConfig {
                    kind: k.into(),
                    root: PathBuf::new(),
                    policy: None,
                    facts: Default::default(),
                    settings: Default::default(),
                })
                .collect(),
            policy: crate::config::PolicyConfig {
                compile_cache: false,
                ..Default::default()
            },
            ..Default::default()
        };
        let policies = PolicySet::from_config(&config).unwrap();
        let bare = env(&[("HOME", "/home/w"), ("USER", "w")], None);
        let mut caches = config.caches.clone();
        let origins = resolve_cache_roots(&mut caches, &policies, &bare).unwrap();
        for (cache, origin) in caches.iter().zip(&origins) {
            assert!(
                cache.root.is_absolute(),
                "{}: {}",
                cache.kind,
                cache.root.display()
            );
            assert!(
                matches!(origin, RootOrigin::Default { .. }),
                "{}: {origin}",
                cache.kind
            );
            let info = policies.get(&cache.kind).unwrap().info().clone();
            let Some(first) = info.root_env.first() else {
                // No variable of its own (Inductor's precompiled headers follow only the
                // temp dir): the default template moves with the variable it names.
                assert!(
                    info.default_root.starts_with("$TMPDIR/"),
                    "{}: no root_env and a default root {:?} that no variable moves",
                    cache.kind,
                    info.default_root
                );
                let moved = env(
                    &[("HOME", "/home/w"), ("USER", "w"), ("TMPDIR", "/moved")],
                    None,
                );
                let (path, origin) = resolve(&info, &moved).unwrap();
                assert!(
                    path.starts_with("/moved"),
                    "{}: {}",
                    cache.kind,
                    path.display()
                );
                assert!(
                    matches!(origin, RootOrigin::Default { .. }),
                    "{}: {origin}",
                    cache.kind
                );
                continue;
            };
            let var = first.split_once('/').map_or(first.as_str(), |(v, _)| v);
            let moved = env(&[("HOME", "/home/w"), ("USER", "w"), (var, "/moved")], None);
            let (path, origin) = resolve(&info, &moved).unwrap();
            assert!(
                path.starts_with("/moved"),
                "{}: {}",
                cache.kind,
                path.display()
            );
            assert!(
                matches!(origin, RootOrigin::Env { .. }),
                "{}: {origin}",
                cache.kind
            );
        }
        let mut native = vec![crate::config::CacheConfig {
            kind: "kernels".into(),
            root: PathBuf::new(),
            policy: Some(crate::config::NATIVE_POLICY.into()),
            facts: Default::default(),
            settings: Default::default(),
        }];
        let set = PolicySet::from_policies([(
            "kernels".to_string(),
            Box::new(NativeRules::new("kernels")) as Box<dyn CachePolicy>,
        )]);
        let err = resolve_cache_roots(&mut native, &set, &bare)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no default root") && err.contains("--cache kernels=ROOT"),
            "{err}"
        );
        // A given root is left alone.
        native[0].root = PathBuf::from("/data/k");
        assert_eq!(
            resolve_cache_roots(&mut native, &set, &bare).unwrap(),
            vec![RootOrigin::Given]
        );
    }
}
