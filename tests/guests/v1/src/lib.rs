//! A policy built against policy contract 1 (jitship:policy@1.0.0, the WIT as it was before
//! contract 3): the host must refuse it before instantiating it and say how to rebuild it.

wit_bindgen::generate!({ path: "../wit-v1", world: "policy" });

struct V1;

impl Guest for V1 {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "from-the-past".into(),
            version: "1.0.0".into(),
            cache_kind: "test".into(),
            default_root: String::new(),
            root_env: vec![],
            description: String::new(),
        }
    }
    fn compat_key(_: Vec<Fact>) -> Result<String, PolicyError> {
        // Uses the host import so the component's import names carry the version too.
        jitship::policy::host::log(jitship::policy::host::Level::Info, "v1");
        Ok("k".into())
    }
    fn select(entries: Vec<FileEntry>) -> Result<Vec<Decision>, PolicyError> {
        Err(PolicyError::Internal(format!("{} entries", entries.len())))
    }
    fn retain(
        _: Vec<GenerationSummary>,
        _: u64,
        _: RetentionLimits,
    ) -> Result<Vec<String>, PolicyError> {
        Ok(vec![])
    }
}

export!(V1);
