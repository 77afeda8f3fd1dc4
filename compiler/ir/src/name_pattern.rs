//! Shell-style patterns over node and value names (`--keep-fp32`,
//! `--force`, `--keep-values`): one definition of what `*`, `?` and `[...]`
//! mean wherever a flag names nodes.

use std::fmt;
use std::str::FromStr;

/// A name pattern: `*` matches any run of characters (`/` included: ONNX
/// names are paths like `/encoder/layer.0/Add_output_0`), `?` one
/// character, `[abc]`/`[!abc]` one of (not of) a set. A pattern that is not
/// a well-formed glob (an unclosed `[`) matches its own text literally.
#[derive(Clone, Debug)]
pub struct NamePattern {
    text: String,
    glob: glob::Pattern,
}

impl NamePattern {
    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        self.glob.matches(name)
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for NamePattern {
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<NamePattern, Self::Err> {
        let glob = glob::Pattern::new(text)
            .or_else(|_| glob::Pattern::new(&glob::Pattern::escape(text)))
            .expect("an escaped pattern is well-formed");
        Ok(NamePattern {
            text: text.to_owned(),
            glob,
        })
    }
}

impl PartialEq for NamePattern {
    fn eq(&self, other: &NamePattern) -> bool {
        self.text == other.text
    }
}

impl Eq for NamePattern {}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::NamePattern;

    fn matches(pattern: &str, name: &str) -> bool {
        pattern.parse::<NamePattern>().unwrap().matches(name)
    }

    #[test]
    fn stars_cross_slashes_and_question_marks_take_one_character() {
        assert!(matches("/encoder/*", "/encoder/layer.0/Add_output_0"));
        assert!(matches("*Add*", "/encoder/layer.0/Add_output_0"));
        assert!(matches("conv?", "conv1"));
        assert!(!matches("conv?", "conv12"));
        assert!(!matches("/decoder/*", "/encoder/x"));
        assert!(matches("conv[12]", "conv2"));
    }

    #[test]
    fn a_malformed_class_matches_literally() {
        assert!(matches("x[0", "x[0"));
        assert!(!matches("x[0", "x0"));
    }

    #[test]
    fn long_names_against_many_stars_stay_fast() {
        // A backtracking matcher takes exponential time here.
        let name = "a".repeat(200);
        assert!(!matches(&format!("{}b", "a*".repeat(30)), &name));
    }
}
