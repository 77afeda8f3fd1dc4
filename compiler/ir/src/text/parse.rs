//! The parser: tokens to a [`Graph`], built through the graph's own
//! constructors so that inference runs on every node.

use super::lex::{lex, lex_string, Tok, Token};
use crate::fused::{DenseHead, DenseOp, ElementwiseProgram, FusedKernel, FusedStore, Instr, Reg};
use crate::op::{
    Col2Im, Conv2d, CoordinateTransform, NearestRounding, Pool2d, Resize, ResizeMode, SliceAxis,
};
use crate::{
    AttributeReader, BinaryOp, BitwiseOp, CompareOp, DType, Data, Graph, Ints, IrError, LogicalOp,
    NodeId, Op, ReduceOp, Shape, Tensor, UnaryOp, ValueType,
};
use half::{bf16, f16};
use smallvec::SmallVec;
use std::collections::HashMap;

pub(super) fn parse_graph(text: &str) -> Result<Graph, IrError> {
    let lexed = lex(text)?;
    let mut p = Parser {
        tokens: lexed.tokens,
        pos: 0,
        comments: lexed.comments,
        graph: Graph::new(),
        values: HashMap::new(),
    };
    p.graph()?;
    Ok(p.graph)
}

fn err(line: usize, message: impl Into<String>) -> IrError {
    IrError::Parse {
        line,
        message: message.into(),
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    comments: HashMap<usize, String>,
    graph: Graph,
    /// Defined values: node and line of definition.
    values: HashMap<String, (NodeId, usize)>,
}

/// An attribute value as written, converted when the op is known.
#[derive(Clone, Debug)]
enum AttrValue {
    /// A number (`1`, `-0.5`, `inf`, `nan:0x7fc00001`).
    Num(String),
    /// `true` or `false`.
    Bool(bool),
    /// Another identifier (a dtype).
    Ident(String),
    /// `[...]` of numbers or `start:step:len` triples.
    List(Vec<ListItem>),
    /// A string literal (a fused kernel's body).
    Str(String),
}

#[derive(Clone, Debug)]
enum ListItem {
    Num(String),
    Slice(String, String, String),
}

impl AttrValue {
    fn describe(&self) -> String {
        match self {
            AttrValue::Num(s) | AttrValue::Ident(s) => format!("`{s}`"),
            AttrValue::Bool(b) => format!("`{b}`"),
            AttrValue::List(_) => "a list".to_string(),
            AttrValue::Str(s) => super::print::quote(s),
        }
    }
}

impl Parser {
    // ---- token helpers ----

    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].tok
    }

    fn line(&self) -> usize {
        self.tokens[self.pos].line
    }

    fn next(&mut self) -> Token {
        let t = self.tokens[self.pos].clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn unexpected(&self, expected: &str) -> IrError {
        err(
            self.line(),
            format!("expected {expected}, found {}", self.peek().describe()),
        )
    }

    fn is_punct(&self, c: char) -> bool {
        *self.peek() == Tok::Punct(c)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        let found = self.is_punct(c);
        if found {
            self.next();
        }
        found
    }

    fn expect_punct(&mut self, c: char, context: &str) -> Result<usize, IrError> {
        if self.is_punct(c) {
            Ok(self.next().line)
        } else {
            Err(self.unexpected(&format!("`{c}` {context}")))
        }
    }

    fn is_ident(&self, s: &str) -> bool {
        matches!(self.peek(), Tok::Ident(i) if i == s)
    }

    fn expect_ident(&mut self, what: &str) -> Result<(String, usize), IrError> {
        match self.peek().clone() {
            Tok::Ident(s) => Ok((s, self.next().line)),
            _ => Err(self.unexpected(what)),
        }
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<(), IrError> {
        if self.is_ident(kw) {
            self.next();
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{kw}`")))
        }
    }

    /// A number (or `inf`/`nan`, `nan:0x<bits>`, `true`/`false`) as text.
    fn scalar(&mut self, what: &str) -> Result<(String, usize), IrError> {
        let line = self.line();
        match self.peek().clone() {
            Tok::Number(s) => {
                self.next();
                Ok((s, line))
            }
            Tok::Ident(s) if matches!(s.as_str(), "inf" | "nan" | "true" | "false") => {
                self.next();
                if s == "nan" && self.eat_punct(':') {
                    match self.peek().clone() {
                        Tok::Number(bits) => {
                            self.next();
                            return Ok((format!("nan:{bits}"), line));
                        }
                        _ => {
                            return Err(
                                self.unexpected("NaN bits after `nan:` (like `nan:0x7fc00001`)")
                            )
                        }
                    }
                }
                Ok((s, line))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn value_ref(&mut self) -> Result<NodeId, IrError> {
        let line = self.line();
        match self.peek().clone() {
            Tok::Value(v) => {
                self.next();
                self.values
                    .get(&v)
                    .map(|&(id, _)| id)
                    .ok_or_else(|| err(line, format!("use of undefined value %{v}")))
            }
            _ => Err(self.unexpected("a value like `%3`")),
        }
    }

    /// `%name` being defined; fails on a redefinition.
    fn value_def(&mut self) -> Result<(String, usize), IrError> {
        let line = self.line();
        match self.peek().clone() {
            Tok::Value(v) => {
                if let Some((_, first)) = self.values.get(&v) {
                    return Err(err(
                        line,
                        format!("value %{v} is already defined on line {first}"),
                    ));
                }
                self.next();
                Ok((v, line))
            }
            _ => Err(self.unexpected("a value definition like `%3: f32[1,4] = ...`")),
        }
    }

    fn ty(&mut self) -> Result<ValueType, IrError> {
        let (name, line) = self.expect_ident("an element type like `f32`")?;
        let dtype = DType::from_name(&name).ok_or_else(|| err(line, unknown_dtype(&name)))?;
        self.expect_punct('[', "to open the shape (a scalar is `f32[]`)")?;
        let mut shape = Shape::new();
        if !self.eat_punct(']') {
            loop {
                let (d, line) = self.scalar("a dimension")?;
                shape.push(
                    parse_usize(&d).ok_or_else(|| err(line, format!("bad dimension `{d}`")))?,
                );
                if self.eat_punct(']') {
                    break;
                }
                self.expect_punct(',', "or `]` in the shape")?;
            }
        }
        Ok(ValueType { dtype, shape })
    }

    // ---- grammar ----

    /// `graph(inputs) { statements return outputs }`
    fn graph(&mut self) -> Result<(), IrError> {
        self.expect_keyword("graph")?;
        self.expect_punct('(', "after `graph`")?;
        if !self.eat_punct(')') {
            loop {
                let (v, line) = self.value_def()?;
                self.expect_punct(':', "after the input value")?;
                let ty = self.ty()?;
                let name = match self.peek().clone() {
                    Tok::Str(s) => {
                        self.next();
                        s
                    }
                    _ => v.clone(),
                };
                let id = self.graph.add_input(name, ty);
                self.values.insert(v, (id, line));
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',', "or `)` after a graph input")?;
            }
        }
        self.expect_punct('{', "to open the graph body")?;
        while !self.is_ident("return") {
            if matches!(self.peek(), Tok::Value(_)) {
                self.statement()?;
            } else {
                return Err(self.unexpected("a node line `%n: type = op(...)` or `return`"));
            }
        }
        self.next();
        if !self.is_punct('}') {
            loop {
                let id = self.value_ref_named()?;
                self.graph.add_output(id.1, id.0);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct('}', "to close the graph")?;
        if *self.peek() != Tok::Eof {
            return Err(self.unexpected("end of input after the graph"));
        }
        Ok(())
    }

    /// An output: `%v` with an optional name string (default: `v`).
    fn value_ref_named(&mut self) -> Result<(NodeId, String), IrError> {
        let default = match self.peek() {
            Tok::Value(v) => v.clone(),
            _ => String::new(),
        };
        let id = self.value_ref()?;
        let name = match self.peek().clone() {
            Tok::Str(s) => {
                self.next();
                s
            }
            _ => default,
        };
        Ok((id, name))
    }

    /// `%v: type = const ...` or `%v: type = op(args) {attrs}`, then the
    /// optional `# onnx: name` comment on the line of its last token.
    fn statement(&mut self) -> Result<(), IrError> {
        let (v, line) = self.value_def()?;
        self.expect_punct(':', "after the value being defined")?;
        let declared = self.ty()?;
        self.expect_punct('=', "after the value's type")?;
        let (op_name, op_line) = self.expect_ident("an op name")?;
        if op_name == "input" || !Op::vocabulary().iter().any(|(n, _)| *n == op_name) {
            // Report an unknown op before anything about its operands.
            return Err(build_op(&op_name, op_line, vec![]).expect_err("unknown op"));
        }
        let (op, args) = if op_name == "const" {
            (Op::Constant(self.constant(&v, &declared)?), vec![])
        } else {
            let mut args = Vec::new();
            self.expect_punct('(', &format!("after `{op_name}`"))?;
            if !self.eat_punct(')') {
                loop {
                    args.push(self.value_ref()?);
                    if self.eat_punct(')') {
                        break;
                    }
                    self.expect_punct(',', "or `)` in the operand list")?;
                }
            }
            let attrs = if self.is_punct('{') {
                self.attributes()?
            } else {
                vec![]
            };
            (build_op(&op_name, op_line, attrs)?, args)
        };
        let last_line = self.tokens[self.pos.saturating_sub(1)].line;
        let name = match self.comments.get(&last_line) {
            Some(c) => onnx_name(c, last_line)?.unwrap_or_default(),
            None => String::new(),
        };
        let id = match op {
            Op::Constant(t) => self.graph.add_const(name, t),
            op => {
                let id = self
                    .graph
                    .add_node(op, &args, name)
                    .map_err(|e| err(line, format!("%{v}: {e}")))?;
                let inferred = &self.graph.node(id).ty;
                if *inferred != declared {
                    return Err(err(
                        line,
                        format!("%{v} is declared {declared} but {op_name} gives {inferred}"),
                    ));
                }
                id
            }
        };
        self.values.insert(v, (id, line));
        Ok(())
    }

    /// After `const`: `dense<[e, ...]>` or `elided<N x dtype, fnv1a=0x...>`.
    fn constant(&mut self, v: &str, declared: &ValueType) -> Result<Tensor, IrError> {
        let (kind, line) = self.expect_ident("`dense<[...]>` after `const`")?;
        match kind.as_str() {
            "dense" => {
                self.expect_punct('<', "after `dense`")?;
                self.expect_punct('[', "to open the elements")?;
                let mut elements = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        elements.push(self.scalar("a constant element")?);
                        if self.eat_punct(']') {
                            break;
                        }
                        self.expect_punct(',', "or `]` between elements")?;
                    }
                }
                self.expect_punct('>', "after the elements")?;
                let Some(n) = declared
                    .checked_size_bytes()
                    .map(|_| declared.num_elements())
                else {
                    return Err(err(
                        line,
                        format!("%{v} is declared {declared}, larger than any addressable tensor"),
                    ));
                };
                if elements.len() != n {
                    return Err(err(
                        line,
                        format!(
                            "%{v} is declared {declared} ({n} elements) but its constant has {}",
                            elements.len()
                        ),
                    ));
                }
                let data = parse_elements(declared.dtype, &elements)?;
                Ok(Tensor::new(&declared.shape, data).expect("element count checked"))
            }
            "elided" => Err(err(
                line,
                format!(
                    "constant %{v} is elided: this dump was printed without full constants, \
                     so its elements are not in the text; print the graph with \
                     `PrintOptions {{ full_constants: true }}` to get a dump that parses"
                ),
            )),
            other => Err(err(
                line,
                format!("unknown constant form `{other}` (expected `dense<[...]>`)"),
            )),
        }
    }

    /// `{name=value, ...}`
    fn attributes(&mut self) -> Result<Vec<(String, AttrValue, usize)>, IrError> {
        self.expect_punct('{', "")?;
        let mut attrs: Vec<(String, AttrValue, usize)> = Vec::new();
        if self.eat_punct('}') {
            return Ok(attrs);
        }
        loop {
            let (name, line) = self.expect_ident("an attribute name")?;
            if attrs.iter().any(|(n, _, _)| *n == name) {
                return Err(err(line, format!("attribute `{name}` is given twice")));
            }
            self.expect_punct('=', &format!("after attribute `{name}`"))?;
            let value = self.attr_value()?;
            attrs.push((name, value, line));
            if self.eat_punct('}') {
                return Ok(attrs);
            }
            self.expect_punct(',', "or `}` between attributes")?;
        }
    }

    fn attr_value(&mut self) -> Result<AttrValue, IrError> {
        match self.peek().clone() {
            Tok::Punct('[') => {
                self.next();
                let mut items = Vec::new();
                if self.eat_punct(']') {
                    return Ok(AttrValue::List(items));
                }
                loop {
                    let (a, _) = self.scalar("a list element")?;
                    if self.eat_punct(':') {
                        let (b, _) = self.scalar("the step of `start:step:len`")?;
                        self.expect_punct(':', "in `start:step:len`")?;
                        let (c, _) = self.scalar("the length of `start:step:len`")?;
                        items.push(ListItem::Slice(a, b, c));
                    } else {
                        items.push(ListItem::Num(a));
                    }
                    if self.eat_punct(']') {
                        return Ok(AttrValue::List(items));
                    }
                    self.expect_punct(',', "or `]` in the list")?;
                }
            }
            Tok::Ident(s) if s == "true" || s == "false" => {
                self.next();
                Ok(AttrValue::Bool(s == "true"))
            }
            Tok::Str(s) => {
                self.next();
                Ok(AttrValue::Str(s))
            }
            Tok::Ident(s) if s != "inf" && s != "nan" => {
                self.next();
                Ok(AttrValue::Ident(s))
            }
            _ => Ok(AttrValue::Num(self.scalar("an attribute value")?.0)),
        }
    }
}

/// The name in a `# onnx: name` comment (`None` for another comment).
fn onnx_name(comment: &str, line: usize) -> Result<Option<String>, IrError> {
    let Some(rest) = comment.trim_start().strip_prefix("onnx:") else {
        return Ok(None);
    };
    let rest = rest.trim();
    if rest.starts_with('"') {
        let chars: Vec<char> = rest.chars().collect();
        let (s, end) = lex_string(&chars, 0, line)?;
        if end != chars.len() {
            return Err(err(line, "text after the quoted node name in `# onnx:`"));
        }
        Ok(Some(s))
    } else {
        Ok(Some(rest.to_string()))
    }
}

fn unknown_dtype(name: &str) -> String {
    let known: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    format!(
        "unknown element type `{name}` (known: {})",
        known.join(", ")
    )
}

fn parse_usize(s: &str) -> Option<usize> {
    s.parse().ok()
}

/// Parses `inf`, `-inf`, `nan`, `nan:0x<bits>` (bits of the target width,
/// which must be a NaN) or a decimal float.
fn parse_float_bits(s: &str, width: u32) -> Result<Option<u64>, ()> {
    if let Some(bits) = s.strip_prefix("nan:") {
        let hex = bits.strip_prefix("0x").ok_or(())?;
        let b = u64::from_str_radix(hex, 16).map_err(|_| ())?;
        if width < 64 && b >> width != 0 {
            return Err(());
        }
        return Ok(Some(b));
    }
    Ok(None)
}

fn parse_f64(s: &str) -> Option<f64> {
    match s {
        "inf" | "+inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => match parse_float_bits(s, 64) {
            Ok(Some(b)) => Some(f64::from_bits(b)).filter(|x| x.is_nan()),
            Ok(None) if s.bytes().any(|b| b.is_ascii_digit()) => s.parse().ok(),
            _ => None,
        },
    }
}

fn parse_f32(s: &str) -> Option<f32> {
    match s {
        "inf" | "+inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        "nan" => Some(f32::NAN),
        _ => match parse_float_bits(s, 32) {
            Ok(Some(b)) => Some(f32::from_bits(b as u32)).filter(|x| x.is_nan()),
            Ok(None) if s.bytes().any(|b| b.is_ascii_digit()) => s.parse().ok(),
            _ => None,
        },
    }
}

fn parse_f16(s: &str) -> Option<f16> {
    match parse_float_bits(s, 16) {
        Ok(Some(b)) => Some(f16::from_bits(b as u16)).filter(|x| x.is_nan()),
        Ok(None) if s == "nan" => Some(f16::NAN),
        Ok(None) => parse_f32(s).map(f16::from_f32),
        Err(()) => None,
    }
}

fn parse_bf16(s: &str) -> Option<bf16> {
    match parse_float_bits(s, 16) {
        Ok(Some(b)) => Some(bf16::from_bits(b as u16)).filter(|x| x.is_nan()),
        Ok(None) if s == "nan" => Some(bf16::NAN),
        Ok(None) => parse_f32(s).map(bf16::from_f32),
        Err(()) => None,
    }
}

fn parse_elements(dtype: DType, elements: &[(String, usize)]) -> Result<Data, IrError> {
    fn each<T>(
        elements: &[(String, usize)],
        dtype: DType,
        f: impl Fn(&str) -> Option<T>,
    ) -> Result<Vec<T>, IrError> {
        elements
            .iter()
            .map(|(s, line)| {
                f(s).ok_or_else(|| err(*line, format!("`{s}` is not a valid {dtype} element")))
            })
            .collect()
    }
    Ok(match dtype {
        DType::F32 => Data::F32(each(elements, dtype, parse_f32)?),
        DType::F16 => Data::F16(each(elements, dtype, parse_f16)?),
        DType::BF16 => Data::BF16(each(elements, dtype, parse_bf16)?),
        DType::F64 => Data::F64(each(elements, dtype, parse_f64)?),
        DType::I8 => Data::I8(each(elements, dtype, |s| s.parse().ok())?),
        DType::U8 => Data::U8(each(elements, dtype, |s| s.parse().ok())?),
        DType::I16 => Data::I16(each(elements, dtype, |s| s.parse().ok())?),
        DType::I32 => Data::I32(each(elements, dtype, |s| s.parse().ok())?),
        DType::I64 => Data::I64(each(elements, dtype, |s| s.parse().ok())?),
        DType::U16 => Data::U16(each(elements, dtype, |s| s.parse().ok())?),
        DType::U32 => Data::U32(each(elements, dtype, |s| s.parse().ok())?),
        DType::U64 => Data::U64(each(elements, dtype, |s| s.parse().ok())?),
        DType::Bool => Data::Bool(each(elements, dtype, |s| match s {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        })?),
        // Narrow types print their codes in hex (`0x3c`).
        d => {
            let bits = crate::narrow::code_bits(d).unwrap_or(8);
            Data::Narrow(
                d,
                each(elements, dtype, |s| {
                    let code = u8::from_str_radix(s.strip_prefix("0x")?, 16).ok()?;
                    ((code as u32) >> bits == 0).then_some(code)
                })?,
            )
        }
    })
}

/// The attributes of one op line, consumed as the op is built; what is left
/// is unknown to the op.
struct Attrs {
    op: String,
    line: usize,
    items: Vec<(String, AttrValue, usize)>,
}

impl Attrs {
    fn take(&mut self, name: &str) -> Option<(AttrValue, usize)> {
        let i = self.items.iter().position(|(n, _, _)| n == name)?;
        let (_, v, line) = self.items.remove(i);
        Some((v, line))
    }

    fn bad(&self, name: &str, line: usize, expected: &str, got: &AttrValue) -> IrError {
        err(
            line,
            format!(
                "attribute `{name}` of {} must be {expected}, got {}",
                self.op,
                got.describe()
            ),
        )
    }

    fn required<T>(
        &mut self,
        name: &str,
        conv: fn(&mut Self, &str, AttrValue, usize) -> Result<T, IrError>,
    ) -> Result<T, IrError> {
        match self.take(name) {
            Some((v, line)) => conv(self, name, v, line),
            None => Err(err(
                self.line,
                format!("{} needs attribute `{name}`", self.op),
            )),
        }
    }

    fn optional<T>(
        &mut self,
        name: &str,
        default: T,
        conv: fn(&mut Self, &str, AttrValue, usize) -> Result<T, IrError>,
    ) -> Result<T, IrError> {
        match self.take(name) {
            Some((v, line)) => conv(self, name, v, line),
            None => Ok(default),
        }
    }

    fn f32(&mut self, name: &str, v: AttrValue, line: usize) -> Result<f32, IrError> {
        match &v {
            AttrValue::Num(s) => parse_f32(s).ok_or_else(|| self.bad(name, line, "a float", &v)),
            _ => Err(self.bad(name, line, "a float", &v)),
        }
    }

    fn usize(&mut self, name: &str, v: AttrValue, line: usize) -> Result<usize, IrError> {
        match &v {
            AttrValue::Num(s) => {
                parse_usize(s).ok_or_else(|| self.bad(name, line, "a non-negative integer", &v))
            }
            _ => Err(self.bad(name, line, "a non-negative integer", &v)),
        }
    }

    fn bool(&mut self, name: &str, v: AttrValue, line: usize) -> Result<bool, IrError> {
        match v {
            AttrValue::Bool(b) => Ok(b),
            v => Err(self.bad(name, line, "`true` or `false`", &v)),
        }
    }

    fn dtype(&mut self, name: &str, v: AttrValue, line: usize) -> Result<DType, IrError> {
        match &v {
            AttrValue::Ident(s) => DType::from_name(s).ok_or_else(|| err(line, unknown_dtype(s))),
            _ => Err(self.bad(name, line, "an element type like `f16`", &v)),
        }
    }

    fn ints(&mut self, name: &str, v: AttrValue, line: usize) -> Result<Ints, IrError> {
        let expected = "a list of non-negative integers like `[0,2,1]`";
        match &v {
            AttrValue::List(items) => items
                .iter()
                .map(|item| match item {
                    ListItem::Num(s) => parse_usize(s),
                    ListItem::Slice(..) => None,
                })
                .collect::<Option<Ints>>()
                .ok_or_else(|| self.bad(name, line, expected, &v)),
            _ => Err(self.bad(name, line, expected, &v)),
        }
    }

    fn array<const N: usize>(
        &mut self,
        name: &str,
        v: AttrValue,
        line: usize,
    ) -> Result<[usize; N], IrError> {
        let list = self.ints(name, v, line)?;
        <[usize; N]>::try_from(list.as_slice()).map_err(|_| {
            err(
                line,
                format!(
                    "attribute `{name}` of {} must have {N} elements, got {}",
                    self.op,
                    list.len()
                ),
            )
        })
    }

    fn ident(&mut self, name: &str, v: AttrValue, line: usize) -> Result<String, IrError> {
        match v {
            AttrValue::Ident(s) => Ok(s),
            v => Err(self.bad(name, line, "a name", &v)),
        }
    }

    fn f32s(
        &mut self,
        name: &str,
        v: AttrValue,
        line: usize,
    ) -> Result<SmallVec<[f32; 4]>, IrError> {
        let expected = "a list of floats like `[1,2.5]`";
        match &v {
            AttrValue::List(items) => items
                .iter()
                .map(|item| match item {
                    ListItem::Num(s) => parse_f32(s),
                    ListItem::Slice(..) => None,
                })
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(name, line, expected, &v)),
            _ => Err(self.bad(name, line, expected, &v)),
        }
    }

    /// An identifier attribute naming one of `options`.
    fn choice<T: Copy>(
        &mut self,
        name: &str,
        default: T,
        options: &[T],
        name_of: fn(&T) -> &'static str,
    ) -> Result<T, IrError> {
        let Some((v, line)) = self.take(name) else {
            return Ok(default);
        };
        let got = self.ident(name, v, line)?;
        options
            .iter()
            .find(|o| name_of(o) == got)
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(name_of).collect();
                err(
                    line,
                    format!(
                        "attribute `{name}` of {} must be one of {}, got `{got}`",
                        self.op,
                        names.join(", ")
                    ),
                )
            })
    }

    /// `fused` attributes: an optional `head` (an op name) with
    /// `head_inputs` and the head op's own attributes, and the `body`
    /// string (see [`ElementwiseProgram::to_text`]).
    fn fused(&mut self) -> Result<Op, IrError> {
        let body = match self.take("body") {
            Some((AttrValue::Str(s), line)) => (s, line),
            Some((v, line)) => return Err(self.bad("body", line, "a string", &v)),
            None => return Err(err(self.line, "fused needs attribute `body`")),
        };
        let store = match self.take("store") {
            Some((v, line)) => {
                let d = self.dtype("store", v, line)?;
                FusedStore::from_dtype(d)
                    .ok_or_else(|| err(line, format!("a fused kernel stores f32 or u8, not {d}")))?
            }
            None => FusedStore::F32,
        };
        let head = match self.take("head") {
            Some((v, line)) => {
                let name = self.ident("head", v, line)?;
                let inputs = self.required("head_inputs", Self::usize)?;
                let rest = std::mem::take(&mut self.items);
                let op = build_op(&name, line, rest)?;
                let op = DenseOp::from_op(&op).ok_or_else(|| {
                    err(
                        line,
                        format!("the head of a fused kernel is matmul, gemm or conv, got `{name}`"),
                    )
                })?;
                Some(DenseHead { op, inputs })
            }
            None => None,
        };
        let program = parse_body(&body.0).map_err(|m| err(body.1, format!("fused body: {m}")))?;
        FusedKernel::new(head, program)
            .map(|k| Op::Fused(Box::new(k.with_store(store))))
            .map_err(|e| err(body.1, e.to_string()))
    }

    fn resize(&mut self) -> Result<Resize, IrError> {
        let shape = self.required("shape", Self::ints)?;
        let scales = self.required("scales", Self::f32s)?;
        let coord = self.choice(
            "coord",
            CoordinateTransform::HalfPixel,
            &CoordinateTransform::ALL,
            CoordinateTransform::name,
        )?;
        let line = self.line;
        let mode = match self
            .optional("mode", "nearest".to_string(), Self::ident)?
            .as_str()
        {
            "nearest" => ResizeMode::Nearest(self.choice(
                "nearest",
                NearestRounding::RoundPreferFloor,
                &NearestRounding::ALL,
                NearestRounding::name,
            )?),
            "linear" => ResizeMode::Linear,
            "cubic" => ResizeMode::Cubic {
                a: self.optional("cubic_a", -0.75, Self::f32)?,
                exclude_outside: self.optional("exclude_outside", false, Self::bool)?,
            },
            other => {
                return Err(err(
                    line,
                    format!("resize mode must be nearest, linear or cubic, got `{other}`"),
                ))
            }
        };
        let antialias = self.optional("antialias", false, Self::bool)?;
        // `roi=[start0,end0,start1,end1,...]`, one pair per axis.
        let flat = self.optional("roi", SmallVec::new(), Self::f32s)?;
        if flat.len() % 2 != 0 {
            return Err(err(line, "roi needs a start and an end per axis"));
        }
        let roi = flat.chunks(2).map(|p| [p[0], p[1]]).collect();
        Ok(Resize {
            shape,
            scales,
            mode,
            coord,
            antialias,
            roi,
        })
    }

    fn slice_axes(
        &mut self,
        name: &str,
        v: AttrValue,
        line: usize,
    ) -> Result<SmallVec<[SliceAxis; 4]>, IrError> {
        let expected = "a list of `start:step:len` like `[0:1:3, 2:-1:2]`";
        match &v {
            AttrValue::List(items) => items
                .iter()
                .map(|item| match item {
                    ListItem::Slice(a, b, c) => Some(SliceAxis {
                        start: parse_usize(a)?,
                        step: b.parse().ok()?,
                        len: parse_usize(c)?,
                    }),
                    ListItem::Num(_) => None,
                })
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(name, line, expected, &v)),
            _ => Err(self.bad(name, line, expected, &v)),
        }
    }

    fn pool(&mut self) -> Result<Pool2d, IrError> {
        Ok(Pool2d {
            kernel: self.required("kernel", Self::array::<2>)?,
            strides: self.optional("strides", [1, 1], Self::array::<2>)?,
            pads: self.optional("pads", [0; 4], Self::array::<4>)?,
            dilations: self.optional("dilations", [1, 1], Self::array::<2>)?,
            ceil_mode: self.optional("ceil_mode", false, Self::bool)?,
        })
    }
}

/// A fused kernel's body: `op(reg, ...) {attrs}, ...` with registers
/// `x<i>` (program input `i`) and `t<j>` (instruction `j`'s result). The
/// program has as many inputs as the highest `x` index read, plus one.
fn parse_body(text: &str) -> Result<ElementwiseProgram, String> {
    let lexed = lex(text).map_err(|e| e.to_string())?;
    let mut p = Parser {
        tokens: lexed.tokens,
        pos: 0,
        comments: HashMap::new(),
        graph: Graph::new(),
        values: HashMap::new(),
    };
    enum Sym {
        Input(usize),
        Temp(usize),
    }
    let mut parsed: Vec<(Op, Vec<Sym>)> = Vec::new();
    let mut inputs = 0;
    loop {
        let (name, line) = p
            .expect_ident("an instruction like `relu(t0)`")
            .map_err(|e| e.to_string())?;
        p.expect_punct('(', &format!("after `{name}`"))
            .map_err(|e| e.to_string())?;
        let mut regs = Vec::new();
        loop {
            let (r, _) = p
                .expect_ident("a register like `x0` or `t1`")
                .map_err(|e| e.to_string())?;
            let index = |s: &str| {
                s.parse::<usize>()
                    .ok()
                    .filter(|&i| i < u32::MAX as usize / 2)
            };
            let sym = match (r.strip_prefix('x'), r.strip_prefix('t')) {
                (Some(i), _) if index(i).is_some() => Sym::Input(index(i).expect("checked")),
                (_, Some(j)) if index(j).is_some() => Sym::Temp(index(j).expect("checked")),
                _ => return Err(format!("bad register `{r}` (expected `x<i>` or `t<j>`)")),
            };
            if let Sym::Input(i) = sym {
                inputs = inputs.max(i + 1);
            }
            regs.push(sym);
            if p.eat_punct(')') {
                break;
            }
            p.expect_punct(',', "or `)` between registers")
                .map_err(|e| e.to_string())?;
        }
        let attrs = if p.is_punct('{') {
            p.attributes().map_err(|e| e.to_string())?
        } else {
            vec![]
        };
        let op = build_op(&name, line, attrs).map_err(|e| e.to_string())?;
        parsed.push((op, regs));
        if !p.eat_punct(',') {
            break;
        }
    }
    if *p.peek() != Tok::Eof {
        return Err(p.unexpected("`,` or the end of the body").to_string());
    }
    let reg = |s: &Sym| match *s {
        Sym::Input(i) => Reg(i as u32),
        Sym::Temp(j) => Reg((inputs + j) as u32),
    };
    let instrs = parsed
        .iter()
        .map(|(op, regs)| match (op, regs.as_slice()) {
            (Op::Unary(u), [a]) => Ok(Instr::Unary(*u, reg(a))),
            (Op::Binary(b), [x, y]) => Ok(Instr::Binary(*b, reg(x), reg(y))),
            (Op::Unary(_) | Op::Binary(_), _) => Err(format!(
                "{} takes {} registers, got {}",
                op.name(),
                op.arity().0,
                regs.len()
            )),
            _ => Err(format!("`{}` is not an elementwise float op", op.name())),
        })
        .collect::<Result<Vec<_>, String>>()?;
    ElementwiseProgram::new(inputs, instrs).map_err(|e| e.to_string())
}

fn build_op(
    name: &str,
    line: usize,
    items: Vec<(String, AttrValue, usize)>,
) -> Result<Op, IrError> {
    let mut a = Attrs {
        op: name.to_string(),
        line,
        items,
    };
    let op =
        if let Some(op) = family_op(name, &mut a)? {
            op
        } else {
            match name {
                "expand" => Op::Expand {
                    shape: a.required("shape", Attrs::ints)?,
                },
                "attention" => Op::Attention {
                    scale: a.required("scale", Attrs::f32)?,
                },
                "layer_norm" => Op::LayerNorm {
                    axis: a.required("axis", Attrs::usize)?,
                    epsilon: a.optional("epsilon", 1e-5, Attrs::f32)?,
                },
                "resize" => Op::Resize(a.resize()?),
                "col2im" => Op::Col2Im(Col2Im {
                    grid: a.required("grid", Attrs::array::<2>)?,
                    image: a.required("image", Attrs::array::<2>)?,
                    block: a.required("block", Attrs::array::<2>)?,
                    strides: a.optional("strides", [1, 1], Attrs::array::<2>)?,
                    dilations: a.optional("dilations", [1, 1], Attrs::array::<2>)?,
                    pads: a.optional("pads", [0, 0], Attrs::array::<2>)?,
                }),
                "fused" => a.fused()?,
                "matmul" => Op::MatMul,
                "matmul_integer" => Op::MatMulInteger,
                "gemm" => Op::Gemm {
                    alpha: a.optional("alpha", 1.0, Attrs::f32)?,
                    beta: a.optional("beta", 1.0, Attrs::f32)?,
                    trans_a: a.optional("trans_a", false, Attrs::bool)?,
                    trans_b: a.optional("trans_b", false, Attrs::bool)?,
                },
                "conv" | "conv_integer" => {
                    let c = Conv2d {
                        strides: a.optional("strides", [1, 1], Attrs::array::<2>)?,
                        pads: a.optional("pads", [0; 4], Attrs::array::<4>)?,
                        dilations: a.optional("dilations", [1, 1], Attrs::array::<2>)?,
                        group: a.optional("group", 1, Attrs::usize)?,
                    };
                    if name == "conv" {
                        Op::Conv(c)
                    } else {
                        Op::ConvInteger(c)
                    }
                }
                "max_pool" => Op::MaxPool(a.pool()?),
                "average_pool" => Op::AveragePool {
                    pool: a.pool()?,
                    count_include_pad: a.optional("count_include_pad", false, Attrs::bool)?,
                },
                "global_average_pool" => Op::GlobalAveragePool,
                "global_max_pool" => Op::GlobalMaxPool,
                "softmax" => Op::Softmax {
                    axis: a.required("axis", Attrs::usize)?,
                },
                "reshape" => Op::Reshape {
                    shape: a.required("shape", Attrs::ints)?,
                },
                "transpose" => Op::Transpose {
                    perm: a.required("perm", Attrs::ints)?,
                },
                "concat" => Op::Concat {
                    axis: a.required("axis", Attrs::usize)?,
                },
                "gather" => Op::Gather {
                    axis: a.optional("axis", 0, Attrs::usize)?,
                },
                "non_zero" => Op::NonZero,
                "unique" => Op::Unique {
                    sorted: a.optional("sorted", true, Attrs::bool)?,
                },
                "non_max_suppression" => Op::NonMaxSuppression(crate::Nms {
                    center_point_box: a.optional("center_point_box", false, Attrs::bool)?,
                    cap: a.required("cap", Attrs::usize)?,
                    has_score_threshold: a.optional("has_score_threshold", false, Attrs::bool)?,
                }),
                "with_length" => Op::WithLength {
                    axis: a.required("axis", Attrs::usize)?,
                },
                "slice" => Op::Slice {
                    axes: a.required("axes", Attrs::slice_axes)?,
                },
                "cast" => Op::Cast {
                    to: a.required("to", Attrs::dtype)?,
                },
                "bitcast" => Op::Bitcast {
                    to: a.required("to", Attrs::dtype)?,
                },
                "not" => Op::Not,
                "bitwise_not" => Op::BitwiseNot,
                "where" => Op::Where,
                "input" => return Err(err(
                    line,
                    "graph inputs are declared in the `graph(...)` header, not as `input` nodes",
                )),
                other => {
                    let names: Vec<&str> = Op::vocabulary()
                        .into_iter()
                        .map(|(n, _)| n)
                        .filter(|&n| n != "input")
                        .collect();
                    return Err(err(
                        line,
                        format!("unknown op `{other}` (known ops: {})", names.join(", ")),
                    ));
                }
            }
        };
    if let Some((attr, _, attr_line)) = a.items.first() {
        let known = op.attribute_names();
        let message = if known.is_empty() {
            format!("{name} has no attributes, got `{attr}`")
        } else {
            format!(
                "unknown attribute `{attr}` for {name} (its attributes: {})",
                known.join(", ")
            )
        };
        return Err(err(*attr_line, message));
    }
    Ok(op)
}

/// The family op `name` with its attributes, `None` when `name` names no
/// family op.
fn family_op(name: &str, a: &mut Attrs) -> Result<Option<Op>, IrError> {
    Ok(Some(if let Some(op) = UnaryOp::from_name(name) {
        Op::Unary(op.read_attributes(a)?)
    } else if let Some(op) = BinaryOp::from_name(name) {
        Op::Binary(op.read_attributes(a)?)
    } else if let Some(op) = CompareOp::from_name(name) {
        Op::Compare(op.read_attributes(a)?)
    } else if let Some(op) = LogicalOp::from_name(name) {
        Op::Logical(op.read_attributes(a)?)
    } else if let Some(op) = BitwiseOp::from_name(name) {
        Op::Bitwise(op.read_attributes(a)?)
    } else if let Some(op) = ReduceOp::from_name(name) {
        Op::Reduce {
            op: op.read_attributes(a)?,
            axes: a.required("axes", Attrs::ints)?,
            keep_dims: a.optional("keep_dims", true, Attrs::bool)?,
        }
    } else {
        return Ok(None);
    }))
}

/// The text's attributes of a family op, read by the family's table.
impl AttributeReader for Attrs {
    type Error = IrError;

    fn read_f32(&mut self, name: &'static str, default: f32) -> Result<f32, IrError> {
        self.optional(name, default, Attrs::f32)
    }

    fn read_bool(&mut self, name: &'static str, default: bool) -> Result<bool, IrError> {
        self.optional(name, default, Attrs::bool)
    }
}
