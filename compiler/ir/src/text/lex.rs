//! The lexer: text to tokens with line numbers. Comments (`#` to the end of
//! the line) are not tokens; they are kept by line so that the parser can
//! read the `# onnx: name` comment of a node line.

use crate::IrError;
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*`: op names, dtypes, keywords, `inf`, `nan`.
    Ident(String),
    /// `%name`, without the `%`.
    Value(String),
    /// A number as written: optional sign, then digits, letters, `.`, `_`
    /// and exponent signs (`1`, `-3`, `1.5e-7`, `0x1f`, `-inf`).
    Number(String),
    /// A string literal, unescaped.
    Str(String),
    /// One of `( ) [ ] { } < > , : =`.
    Punct(char),
    /// End of input.
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Number(s) => format!("number `{s}`"),
            Tok::Str(s) => format!("string {}", super::print::quote(s)),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Token {
    pub tok: Tok,
    /// 1-based line.
    pub line: usize,
}

pub(super) struct Lexed {
    pub tokens: Vec<Token>,
    /// Comment text after `#` (to the end of the line), by line.
    pub comments: HashMap<usize, String>,
}

fn err(line: usize, message: impl Into<String>) -> IrError {
    IrError::Parse {
        line,
        message: message.into(),
    }
}

pub(super) fn lex(text: &str) -> Result<Lexed, IrError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut comments = HashMap::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '#' => {
                let start = i + 1;
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                comments.insert(line, chars[start..i].iter().collect());
            }
            '(' | ')' | '[' | ']' | '{' | '}' | '<' | '>' | ',' | ':' | '=' => {
                tokens.push(Token {
                    tok: Tok::Punct(c),
                    line,
                });
                i += 1;
            }
            '%' => {
                let start = i + 1;
                i = start;
                while i < chars.len() && is_value_char(chars[i]) {
                    i += 1;
                }
                if i == start {
                    return Err(err(
                        line,
                        "expected a value name after `%` (like `%3` or `%x`)",
                    ));
                }
                tokens.push(Token {
                    tok: Tok::Value(chars[start..i].iter().collect()),
                    line,
                });
            }
            '"' => {
                let (s, end) = lex_string(&chars, i, line)?;
                tokens.push(Token {
                    tok: Tok::Str(s),
                    line,
                });
                i = end;
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+')
                    && chars
                        .get(i + 1)
                        .is_some_and(|n| n.is_ascii_alphanumeric() || *n == '.')) =>
            {
                let start = i;
                i += 1;
                while i < chars.len() {
                    let d = chars[i];
                    let exponent_sign = (d == '-' || d == '+')
                        && matches!(chars[i - 1], 'e' | 'E')
                        && !is_hex(&chars[start..i]);
                    if d.is_ascii_alphanumeric() || d == '.' || d == '_' || exponent_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                tokens.push(Token {
                    tok: Tok::Number(chars[start..i].iter().collect()),
                    line,
                });
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                tokens.push(Token {
                    tok: Tok::Ident(chars[start..i].iter().collect()),
                    line,
                });
            }
            c => return Err(err(line, format!("unexpected character {c:?}"))),
        }
    }
    // End of input is reported on the last line that holds a token.
    let line = tokens.last().map_or(line, |t: &Token| t.line);
    tokens.push(Token {
        tok: Tok::Eof,
        line,
    });
    Ok(Lexed { tokens, comments })
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

fn is_hex(s: &[char]) -> bool {
    let s = match s.first() {
        Some('-' | '+') => &s[1..],
        _ => s,
    };
    s.len() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
}

/// Lexes the string literal starting at `chars[start] == '"'`; returns its
/// value and the index after the closing quote.
pub(super) fn lex_string(
    chars: &[char],
    start: usize,
    line: usize,
) -> Result<(String, usize), IrError> {
    let mut s = String::new();
    let mut i = start + 1;
    loop {
        match chars.get(i) {
            None | Some('\n') => {
                return Err(err(
                    line,
                    "unterminated string literal (a newline in a string is written `\\n`)",
                ))
            }
            Some('"') => return Ok((s, i + 1)),
            Some('\\') => {
                i += 1;
                match chars.get(i) {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('r') => s.push('\r'),
                    Some('t') => s.push('\t'),
                    Some('u') if chars.get(i + 1) == Some(&'{') => {
                        let digits_start = i + 2;
                        let mut j = digits_start;
                        while j < chars.len() && chars[j].is_ascii_hexdigit() {
                            j += 1;
                        }
                        let digits: String = chars[digits_start..j].iter().collect();
                        let c = (chars.get(j) == Some(&'}'))
                            .then(|| u32::from_str_radix(&digits, 16).ok())
                            .flatten()
                            .and_then(char::from_u32)
                            .ok_or_else(|| err(line, format!("bad unicode escape `\\u{{{digits}`")))?;
                        s.push(c);
                        i = j;
                    }
                    Some(c) => {
                        return Err(err(
                            line,
                            format!("unknown escape `\\{c}` in string (known: \\\" \\\\ \\n \\r \\t \\u{{hex}})"),
                        ))
                    }
                    None => return Err(err(line, "unterminated string literal")),
                }
                i += 1;
            }
            Some(&c) => {
                s.push(c);
                i += 1;
            }
        }
    }
}
