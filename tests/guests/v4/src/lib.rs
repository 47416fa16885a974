//! A policy built against a future major of the contract (jitship:policy@4.0.0): the host must
//! refuse it before instantiating it, saying it is newer.

wit_bindgen::generate!({ path: "../wit-v4", world: "policy" });

struct V4;

impl Guest for V4 {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "from-the-future".into(),
            version: "4.0.0".into(),
            cache_kind: "test".into(),
            default_root: String::new(),
            root_env: vec![],
            description: String::new(),
        }
    }
    fn compat_key(_: Vec<Fact>) -> Result<String, PolicyError> {
        // Uses the host import so the component's import names carry the version too.
        jitship::policy::host::log(jitship::policy::host::Level::Info, "v4");
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

export!(V4);
