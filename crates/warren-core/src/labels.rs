//! Labels (free `key=value` pairs) and Kubernetes-style label selectors:
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` and `!k`,
//! joined by commas.

use std::collections::BTreeMap;

use thiserror::Error;

pub type Labels = BTreeMap<String, String>;

/// Every sandbox of a batch carries this label with the batch id.
pub const BATCH_LABEL: &str = "warren.dev/batch";
/// A sandbox created to retry an OOM-killed batch member carries this label
/// with the member's id (and is not retried again).
pub const RETRY_LABEL: &str = "warren.dev/retry-of";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LabelError {
    #[error("invalid label key {0:?}: keys are 1-63 characters of letters, digits, '-', '_', '.', optionally prefixed by a DNS name and '/' (e.g. task, warren.dev/batch)")]
    Key(String),
    #[error("invalid label value {value:?} for key {key:?}: values are at most 63 characters of letters, digits, '-', '_', '.'")]
    Value { key: String, value: String },
    #[error("invalid label {0:?}: write it as KEY=VALUE")]
    Pair(String),
    #[error("invalid label selector {0:?}: use k=v, k!=v, 'k in (a,b)', 'k notin (a,b)', k or !k, joined by commas")]
    Selector(String),
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

pub fn validate_key(key: &str) -> Result<(), LabelError> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            let prefix_ok =
                !prefix.is_empty() && prefix.len() <= 253 && prefix.split('.').all(valid_name);
            if !prefix_ok {
                return Err(LabelError::Key(key.to_string()));
            }
            name
        }
        None => key,
    };
    if valid_name(name) {
        Ok(())
    } else {
        Err(LabelError::Key(key.to_string()))
    }
}

pub fn validate_value(key: &str, value: &str) -> Result<(), LabelError> {
    if value.is_empty() || valid_name(value) {
        Ok(())
    } else {
        Err(LabelError::Value {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

pub fn validate(labels: &Labels) -> Result<(), LabelError> {
    for (k, v) in labels {
        validate_key(k)?;
        validate_value(k, v)?;
    }
    Ok(())
}

/// Parses `KEY=VALUE` as given on a command line.
pub fn parse_pair(s: &str) -> Result<(String, String), LabelError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| LabelError::Pair(s.to_string()))?;
    validate_key(k)?;
    validate_value(k, v)?;
    Ok((k.to_string(), v.to_string()))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// A conjunction of requirements; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn parse(input: &str) -> Result<Selector, LabelError> {
        let err = || LabelError::Selector(input.to_string());
        let mut reqs = Vec::new();
        for part in split_top_level(input).map_err(|_| err())? {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            reqs.push(parse_requirement(part).ok_or_else(err)?);
        }
        for r in &reqs {
            let key = match r {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            validate_key(key).map_err(|_| err())?;
        }
        Ok(Selector(reqs))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, ()> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    values.iter().all(|v| valid_name(v)).then_some(values)
}

fn parse_requirement(part: &str) -> Option<Requirement> {
    if let Some((k, v)) = part.split_once("!=") {
        return Some(Requirement::NotEquals(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Some(Requirement::Equals(k.trim().into(), v.trim().into()));
    }
    if let Some(k) = part.strip_prefix('!') {
        return Some(Requirement::NotExists(k.trim().into()));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    match words.next().map(str::trim) {
        None => Some(Requirement::Exists(key.into())),
        Some(rest) => {
            if let Some(set) = rest.strip_prefix("notin") {
                Some(Requirement::NotIn(key.into(), parse_set(set)?))
            } else if let Some(set) = rest.strip_prefix("in") {
                Some(Requirement::In(key.into(), parse_set(set)?))
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors() {
        let l = labels(&[("task", "swe"), ("ver", "3")]);
        let m = |s: &str| Selector::parse(s).map(|sel| sel.matches(&l));
        assert_eq!(m("task=swe"), Ok(true));
        assert_eq!(m("task!=swe"), Ok(false));
        assert_eq!(m("task in (a, swe)"), Ok(true));
        assert_eq!(m("task notin (a,swe)"), Ok(false));
        assert_eq!(m("ver,task=swe"), Ok(true));
        assert_eq!(m("!ver"), Ok(false));
        assert_eq!(m("missing"), Ok(false));
        assert_eq!(m(""), Ok(true));
        assert!(Selector::parse("task in (a").is_err());
        assert!(Selector::parse("bad key=1").is_err());
    }

    #[test]
    fn keys_and_values() {
        assert!(validate_key("warren.dev/batch").is_ok());
        assert!(validate_key("-x").is_err());
        assert!(validate_key("").is_err());
        assert!(validate_value("k", "has space").is_err());
        assert!(parse_pair("novalue").is_err());
        assert_eq!(parse_pair("a=b"), Ok(("a".into(), "b".into())));
    }
}
