//! YAML read into a small tree that remembers each node's line, for imports that name the line
//! of whatever they refuse. Anchors and aliases, tags and non-string keys are refused: limit
//! files have no use for them.

use saphyr_parser::{Event, Parser, ScalarStyle};

/// The most nodes a file may hold, and the deepest nesting.
const NODES_MAX: usize = 200_000;
const DEPTH_MAX: usize = 64;

/// One node and the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub line: usize,
    pub value: Value,
}

/// A node's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar's text, and whether it was quoted (a quoted `true` is a string).
    Scalar(String, bool),
    Seq(Vec<Node>),
    /// Keys in the order written, each with its line.
    Map(Vec<(String, usize, Node)>),
}

impl Node {
    /// The text of a plain `~`, `null` or empty scalar is null.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s, false) if s.is_empty() || s == "~" || s == "null" || s == "Null" || s == "NULL")
    }
}

/// A map's key and its line.
type Key = (String, usize);

/// A reading error: the line and what is wrong.
pub type Refusal = (usize, String);

/// Every document in `text`.
pub fn parse(text: &str) -> Result<Vec<Node>, Refusal> {
    // Open collections: each with its line, and for a map the key waiting for its value.
    let mut stack: Vec<(usize, Value, Option<Key>)> = Vec::new();
    let mut docs = Vec::new();
    let mut count = 0usize;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| (e.marker().line(), format!("not YAML: {}", e.info())))?;
        let line = span.start.line();
        count += 1;
        if count > NODES_MAX {
            return Err((line, format!("more than {NODES_MAX} YAML nodes")));
        }
        let done = match event {
            Event::Alias(_) => return Err((line, "anchors and aliases are not taken".into())),
            Event::Scalar(_, _, _, Some(_))
            | Event::SequenceStart(_, Some(_))
            | Event::MappingStart(_, Some(_)) => {
                return Err((line, "YAML tags are not taken".into()));
            }
            Event::Scalar(text, style, _, None) => {
                Some(Node { line, value: Value::Scalar(text.into_owned(), style != ScalarStyle::Plain) })
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                if stack.len() >= DEPTH_MAX {
                    return Err((line, format!("nested deeper than {DEPTH_MAX}")));
                }
                let value = if matches!(event, Event::SequenceStart(..)) {
                    Value::Seq(Vec::new())
                } else {
                    Value::Map(Vec::new())
                };
                stack.push((line, value, None));
                None
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (line, value, pending) = stack.pop().expect("the parser balances starts and ends");
                debug_assert!(pending.is_none());
                Some(Node { line, value })
            }
            _ => None,
        };
        let Some(node) = done else { continue };
        match stack.last_mut() {
            None => docs.push(node),
            Some((_, Value::Seq(items), _)) => items.push(node),
            Some((_, Value::Map(entries), pending)) => match pending.take() {
                Some((key, key_line)) => {
                    if entries.iter().any(|(k, _, _)| *k == key) {
                        return Err((key_line, format!("{key}: given twice")));
                    }
                    entries.push((key, key_line, node));
                }
                None => match node.value {
                    Value::Scalar(key, _) => *pending = Some((key, node.line)),
                    _ => return Err((node.line, "a key must be text".into())),
                },
            },
            Some((_, Value::Scalar(..), _)) => unreachable!("scalars hold nothing"),
        }
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_keep_their_lines_and_bad_yaml_is_named_by_line() {
        let docs = parse("---\na: 1\nb:\n  - x\n  - 'true'\n---\nc: ~\n").unwrap();
        assert_eq!(docs.len(), 2);
        let Value::Map(entries) = &docs[0].value else { panic!() };
        assert_eq!((entries[0].0.as_str(), entries[0].1), ("a", 2));
        let Value::Seq(items) = &entries[1].2.value else { panic!() };
        assert_eq!(items[1], Node { line: 5, value: Value::Scalar("true".into(), true) });
        let Value::Map(c) = &docs[1].value else { panic!() };
        assert!(c[0].2.is_null());
        assert_eq!(parse("a: 1\na: 2\n").unwrap_err(), (2, "a: given twice".into()));
        assert_eq!(parse("a: &x 1\nb: *x\n").unwrap_err().0, 2);
        assert!(parse("a: [1\n").unwrap_err().1.starts_with("not YAML"));
    }
}
