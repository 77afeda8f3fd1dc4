//! The op vocabulary: each op's text name and its attributes, written once.
//!
//! An op family ([`UnaryOp`](crate::UnaryOp), [`BinaryOp`](crate::BinaryOp),
//! ...) is declared with [`op_family!`]: per variant, its typed attributes
//! with their defaults and its text name. From that one table come the
//! enum, `name()`, `ALL` (every op, attributes at their defaults),
//! `from_name()`, the attribute names and values (what the printer writes)
//! and `read_attributes()` (what the parser and the ONNX frontend read,
//! through an [`AttributeReader`]). [`op_table!`] does the same for [`Op`]
//! itself: the name and attribute names of each variant, a family's taken
//! from the family.
//!
//! [`Op`]: crate::Op

/// A family op's attribute value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Attribute {
    /// A float (`alpha=0.01`).
    F32(f32),
    /// A flag (`tanh=true`).
    Bool(bool),
}

impl From<f32> for Attribute {
    fn from(x: f32) -> Attribute {
        Attribute::F32(x)
    }
}

impl From<bool> for Attribute {
    fn from(b: bool) -> Attribute {
        Attribute::Bool(b)
    }
}

/// Where a family op's attributes are read from (the text parser, the ONNX
/// frontend): each attribute by name, its default when absent.
pub trait AttributeReader {
    /// Why an attribute could not be read.
    type Error;
    /// The float attribute `name`, or `default`.
    fn read_f32(&mut self, name: &'static str, default: f32) -> Result<f32, Self::Error>;
    /// The flag `name`, or `default`.
    fn read_bool(&mut self, name: &'static str, default: bool) -> Result<bool, Self::Error>;
}

/// A type a family op's attribute may have: read through the reader method
/// of its type.
pub trait AttributeType: Copy + Into<Attribute> {
    /// The attribute `name` from `reader`, or `default`.
    fn read<R: AttributeReader>(
        reader: &mut R,
        name: &'static str,
        default: Self,
    ) -> Result<Self, R::Error>;
}

impl AttributeType for f32 {
    fn read<R: AttributeReader>(r: &mut R, name: &'static str, d: f32) -> Result<f32, R::Error> {
        r.read_f32(name, d)
    }
}

impl AttributeType for bool {
    fn read<R: AttributeReader>(r: &mut R, name: &'static str, d: bool) -> Result<bool, R::Error> {
        r.read_bool(name, d)
    }
}

/// Declares an op family from its table: per variant, its attributes as
/// `{ name: type = default, ... }` (the text format's attribute names are
/// the field names) and its text name.
///
/// ```ignore
/// op_family! {
///     /// Elementwise operations with one input.
///     #[derive(Clone, Copy, Debug, PartialEq)]
///     pub enum UnaryOp {
///         Relu => "relu",
///         LeakyRelu { alpha: f32 = 0.01 } => "leaky_relu",
///     }
/// }
/// ```
macro_rules! op_family {
    (
        $(#[$meta:meta])*
        pub enum $family:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident $({ $($field:ident: $ty:ty = $default:expr),+ $(,)? })? => $name:literal,
            )+
        }
    ) => {
        $(#[$meta])*
        pub enum $family {
            $( $(#[$vmeta])* $variant $({ $($field: $ty),+ })?, )+
        }

        impl $family {
            /// Every op of the family, attributes at their defaults, in
            /// declaration order.
            pub const ALL: [$family; [$($name),+].len()] =
                [$( $family::$variant $({ $($field: $default),+ })? ),+];

            /// Text-format name.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $family::$variant { .. } => $name, )+
                }
            }

            /// The op named `name` in the text format, attributes at their
            /// defaults.
            pub fn from_name(name: &str) -> Option<$family> {
                $family::ALL.into_iter().find(|op| op.name() == name)
            }

            /// The names of the op's attributes, in text-format order.
            pub fn attribute_names(&self) -> &'static [&'static str] {
                match self {
                    $( $family::$variant { .. } => &[$($(stringify!($field)),+)?], )+
                }
            }

            /// The op's attributes with their values, in text-format order.
            pub fn attributes(&self) -> Vec<(&'static str, $crate::vocab::Attribute)> {
                match *self {
                    $( $family::$variant $({ $($field),+ })? => vec![
                        $($( (stringify!($field), $field.into()) ),+)?
                    ], )+
                }
            }

            /// The same op with each attribute read from `reader` (its
            /// default when the reader has none).
            #[allow(unused_variables)] // `reader`, by a family without attributes
            pub fn read_attributes<R: $crate::vocab::AttributeReader>(
                &self,
                reader: &mut R,
            ) -> Result<$family, R::Error> {
                #[allow(unused_imports)]
                use $crate::vocab::AttributeType;
                Ok(match self {
                    $( $family::$variant { .. } => $family::$variant $({ $(
                        $field: <$ty>::read(reader, stringify!($field), $default)?
                    ),+ })?, )+
                })
            }
        }
    };
}

/// Declares the text name and attribute names of every [`Op`](crate::Op)
/// variant: a family variant names the field holding the family op and the
/// family's type (its names and attributes are the family op's, followed by
/// the variant's own), any other variant its name and attributes.
macro_rules! op_table {
    (
        families {
            $( $fvariant:ident . $ffield:tt : $ftype:ident [$($fattr:ident),*], )+
        }
        ops {
            $( $variant:ident => $name:literal [$($attr:ident),*], )+
        }
    ) => {
        impl Op {
            /// Text-format name of the op.
            pub fn name(&self) -> &'static str {
                match self {
                    $( Op::$fvariant { $ffield: op, .. } => op.name(), )+
                    $( Op::$variant { .. } => $name, )+
                }
            }

            /// The names of the op's attributes, in text-format order.
            pub fn attribute_names(&self) -> Vec<&'static str> {
                match self {
                    $( Op::$fvariant { $ffield: op, .. } => {
                        [op.attribute_names(), &[$(stringify!($fattr)),*]].concat()
                    } )+
                    $( Op::$variant { .. } => vec![$(stringify!($attr)),*], )+
                }
            }

            /// Every op name with the op's attribute names: the families'
            /// ops first, then the others, in declaration order.
            pub fn vocabulary() -> Vec<(&'static str, Vec<&'static str>)> {
                let mut ops = Vec::new();
                $( for op in $ftype::ALL {
                    let names = [op.attribute_names(), &[$(stringify!($fattr)),*]].concat();
                    ops.push((op.name(), names));
                } )+
                $( ops.push(($name, vec![$(stringify!($attr)),*])); )+
                ops
            }
        }
    };
}

pub(crate) use op_family;
pub(crate) use op_table;
