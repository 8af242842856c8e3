//! Checkers of single values shared by the config's sections ([`super::validate`] and
//! [`super::export`]): each error names the dotted key and what is allowed.

use std::{ops::RangeInclusive, path::Path, path::PathBuf, time::Duration};

use super::{raw::Quantity, InvalidValue};
use crate::units::{format_duration, parse_duration};

/// A duration with a unit (a bare number is refused).
pub(super) fn duration(value: &Quantity, key: &str) -> Result<Duration, InvalidValue> {
    match value {
        Quantity::Text(text) => parse_duration(text).map_err(|_| {
            InvalidValue::new(
                key,
                format!(
                    "{value} is not a duration; write a number and a unit (ns, us, ms, s, m, h or d), \
                     e.g. \"7d\" or \"12h\""
                ),
            )
        }),
        // A bare number is never guessed to be seconds, as on the command line.
        Quantity::Integer(number) => {
            let problem = format!("{number} has no unit; write it as a string, e.g. \"{number}s\"");
            Err(InvalidValue::new(key, problem))
        }
    }
}

pub(super) fn duration_in(
    value: &Quantity,
    key: &str,
    range: RangeInclusive<Duration>,
) -> Result<Duration, InvalidValue> {
    let parsed = duration(value, key)?;
    if !range.contains(&parsed) {
        let (min, max) = (format_duration(*range.start()), format_duration(*range.end()));
        return Err(InvalidValue::new(key, format!("{value} is out of range; allowed {min} to {max}")));
    }
    Ok(parsed)
}

/// The daemon's working directory is not the config file's, so a relative path would be a
/// guess: require absolute ones.
pub(super) fn absolute_path(path: &Path, key: &str, example: &str) -> Result<PathBuf, InvalidValue> {
    if !path.is_absolute() {
        let problem = format!("{:?} is not an absolute path; write e.g. {example:?}", path.display().to_string());
        return Err(InvalidValue::new(key, problem));
    }
    Ok(path.to_owned())
}
