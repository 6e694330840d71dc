//! Dockerfile words: `$VAR` substitution and the splitting of `ENV`,
//! `LABEL` and `ARG` arguments into `key=value` pairs, as Docker does them
//! (`${VAR:-default}`, `${VAR:+alt}`, quotes, the escape character).

use std::collections::BTreeMap;

/// Variables in scope at a step: the stage's `ARG`s and `ENV`s.
pub(crate) type Vars = BTreeMap<String, String>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WordError {
    #[error("unterminated quote in {0:?}")]
    Quote(String),
    #[error(
        "bad substitution in {0:?} (use $NAME, ${{NAME}}, ${{NAME:-default}} or ${{NAME:+alt}})"
    )]
    Substitution(String),
    #[error("{0:?} is not KEY=VALUE")]
    Pair(String),
}

/// `text` as one word: variables substituted, quotes and escapes removed
/// (what Docker does for `FROM`, `COPY`, `WORKDIR`, `USER`, `EXPOSE`).
pub(crate) fn expand(text: &str, vars: &Vars, escape: char) -> Result<String, WordError> {
    let words = scan(text, vars, escape, false)?;
    Ok(words.into_iter().next().unwrap_or_default())
}

/// Splits `text` into words (quotes removed, escapes applied, variables
/// substituted except inside single quotes).
pub(crate) fn words(text: &str, vars: &Vars, escape: char) -> Result<Vec<String>, WordError> {
    scan(text, vars, escape, true)
}

/// `KEY=VALUE …` pairs (`ENV`, `LABEL`), or the old `KEY VALUE` form.
pub(crate) fn pairs(
    text: &str,
    vars: &Vars,
    escape: char,
) -> Result<Vec<(String, String)>, WordError> {
    let text = text.trim();
    let first = text.split_whitespace().next().unwrap_or_default();
    if !first.contains('=') {
        // `ENV KEY value with spaces`: one pair, the rest is the value.
        let rest = text[first.len()..].trim();
        if rest.is_empty() {
            return Err(WordError::Pair(text.to_string()));
        }
        let value = scan(rest, vars, escape, false)?.join("");
        return Ok(vec![(first.to_string(), value)]);
    }
    words(text, vars, escape)?
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(WordError::Pair(w)),
        })
        .collect()
}

fn scan(text: &str, vars: &Vars, escape: char, split: bool) -> Result<Vec<String>, WordError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut i = 0;
    // Quote kind while inside one.
    let mut quote: Option<char> = None;
    while i < chars.len() {
        let c = chars[i];
        if c == escape && quote != Some('\'') && i + 1 < chars.len() {
            word.push(chars[i + 1]);
            in_word = true;
            i += 2;
            continue;
        }
        match (c, quote) {
            ('\'' | '"', None) => {
                quote = Some(c);
                in_word = true;
            }
            (q, Some(open)) if q == open => quote = None,
            ('$', q) if q != Some('\'') => {
                let (value, used) = substitute(&chars[i + 1..], vars, escape, text)?;
                word.push_str(&value);
                in_word = true;
                i += used;
            }
            (c, None) if split && c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (c, _) => {
                word.push(c);
                in_word = true;
            }
        }
        i += 1;
    }
    if quote.is_some() {
        return Err(WordError::Quote(text.to_string()));
    }
    if in_word || (!split && out.is_empty()) {
        out.push(word);
    }
    Ok(out)
}

/// What follows a `$`: the value and how many characters it used.
fn substitute(
    rest: &[char],
    vars: &Vars,
    escape: char,
    text: &str,
) -> Result<(String, usize), WordError> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if rest.first() == Some(&'{') {
        let close = rest
            .iter()
            .position(|&c| c == '}')
            .ok_or_else(|| WordError::Substitution(text.to_string()))?;
        let inner: String = rest[1..close].iter().collect();
        let (name, op) = match inner.find(|c: char| !is_name(c)) {
            Some(at) => (&inner[..at], Some(&inner[at..])),
            None => (inner.as_str(), None),
        };
        if name.is_empty() {
            return Err(WordError::Substitution(text.to_string()));
        }
        let value = vars.get(name);
        let value = match op {
            None => value.cloned().unwrap_or_default(),
            Some(op) if op.starts_with(":-") => match value.filter(|v| !v.is_empty()) {
                Some(v) => v.clone(),
                None => expand(&op[2..], vars, escape)?,
            },
            Some(op) if op.starts_with(":+") => match value.filter(|v| !v.is_empty()) {
                Some(_) => expand(&op[2..], vars, escape)?,
                None => String::new(),
            },
            Some(_) => return Err(WordError::Substitution(text.to_string())),
        };
        return Ok((value, close + 1));
    }
    let len = rest.iter().take_while(|&&c| is_name(c)).count();
    if len == 0 {
        // A lone `$` is itself.
        return Ok(("$".into(), 0));
    }
    let name: String = rest[..len].iter().collect();
    Ok((vars.get(&name).cloned().unwrap_or_default(), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        [("A", "x"), ("E", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitutes_like_docker() {
        let v = vars();
        assert_eq!(expand("/app/$A", &v, '\\').unwrap(), "/app/x");
        assert_eq!(expand("${A}y", &v, '\\').unwrap(), "xy");
        assert_eq!(expand("${B:-d}", &v, '\\').unwrap(), "d");
        assert_eq!(expand("${E:-d}", &v, '\\').unwrap(), "d");
        assert_eq!(expand("${A:+on}", &v, '\\').unwrap(), "on");
        assert_eq!(expand("${B:+on}", &v, '\\').unwrap(), "");
        assert_eq!(expand(r"\$A", &v, '\\').unwrap(), "$A");
        assert_eq!(expand("cost $", &v, '\\').unwrap(), "cost $");
        assert_eq!(expand("\"/my app\"/$A", &v, '\\').unwrap(), "/my app/x");
        assert_eq!(expand("'$A'", &v, '\\').unwrap(), "$A");
        assert!(expand("${A", &v, '\\').is_err());
        assert!(expand("${A?x}", &v, '\\').is_err());
    }

    #[test]
    fn splits_pairs_with_quotes() {
        let v = vars();
        assert_eq!(
            pairs(r#"K=$A L="a b" M='$A' N=a\ b"#, &v, '\\').unwrap(),
            [("K", "x"), ("L", "a b"), ("M", "$A"), ("N", "a b")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(
            pairs("K value with  spaces", &v, '\\').unwrap(),
            vec![("K".to_string(), "value with  spaces".to_string())]
        );
        assert!(pairs("K", &v, '\\').is_err());
        assert!(pairs("=v", &v, '\\').is_err());
        assert!(pairs(r#"K="open"#, &v, '\\').is_err());
    }
}
