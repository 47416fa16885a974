//! One function per command; each returns the process exit code.

pub(crate) mod audit;
pub(crate) mod key;
pub(crate) mod policy;
pub(crate) mod policy_new;
pub(crate) mod run;
pub(crate) mod store;
pub(crate) mod worker;
