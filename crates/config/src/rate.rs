//! Per-principal request rates as the operator writes them (`rate_limit_exec`,
//! `rate_limit_sessions`, `rate_limit_files`): the groups of routes that each have a rate,
//! and the rate's text form. The server's `rate_limit` middleware enforces them.

use std::num::NonZeroU32;
use std::time::Duration;

/// The groups of routes that each have their own rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Starting programs: `POST /v1/exec` and a programmatic start.
    Exec,
    /// Driving programmatic sessions: resumes, `GET` of a session, cancels.
    Sessions,
    /// The file routes: uploads, downloads, lists, deletes.
    Files,
}

impl Group {
    pub const ALL: [Group; 3] = [Group::Exec, Group::Sessions, Group::Files];

    /// The group's place in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The config key that sets the group's rate.
    pub fn config_key(self) -> &'static str {
        match self {
            Group::Exec => "rate_limit_exec",
            Group::Sessions => "rate_limit_sessions",
            Group::Files => "rate_limit_files",
        }
    }
}

/// A rate as the config writes it: `N/s`, `N/min` or `N/h` (N ≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub requests: NonZeroU32,
    pub per: Duration,
}

/// A rate's text that does not parse; the message shows the text and the forms allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a rate: write N/s, N/min or N/h with N at least 1 (e.g. \"60/min\")")]
pub struct BadRate(pub String);

impl std::str::FromStr for Rate {
    type Err = BadRate;

    fn from_str(s: &str) -> Result<Rate, BadRate> {
        let bad = || BadRate(s.to_owned());
        let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let requests = n.trim().parse::<NonZeroU32>().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        Ok(Rate { requests, per })
    }
}
