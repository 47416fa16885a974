//! `jitship policy new`: writes a new policy crate (`policy::scaffold`).

use std::path::PathBuf;

use anyhow::Result;

use crate::cli::args::PolicyNewArgs;
use crate::cli::exit;
use crate::cli::render::policy as render;
use crate::policy::scaffold::{NewPolicy, create};

pub(crate) fn run_policy_new(args: PolicyNewArgs) -> Result<i32> {
    let req = NewPolicy {
        kind: args.kind.clone().unwrap_or_else(|| args.name.clone()),
        dir: args
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&args.name)),
        name: args.name,
    };
    let done = create(&req)?;
    render::created(&done, args.json);
    Ok(exit::OK)
}
