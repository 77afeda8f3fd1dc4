//! Run-time control flow as variants.
//!
//! Kiln's graphs have static shapes, so an `If` whose condition is known
//! only at run time, and a `Loop` whose trip count or condition is, cannot
//! become one graph when the paths differ in shape. Each path through the
//! model's run-time decisions is imported on its own instead (the
//! importer follows `Branches::taken` and stops at the first decision it
//! has no value for), giving one graph of static shapes per path: a
//! **variant**. Every decision becomes a **condition program**, the part
//! of the model that computes its condition on the path before it
//! (`Branches::condition_of`). The artifact holds the variants and the
//! condition programs as profiles of one input shape
//! ([`kiln_format::Role`]); the runtime runs the condition programs a
//! variant's guards name and runs the variant whose guards all hold, so a
//! run computes only the branch it takes.
//!
//! A path that does not import (a branch that cannot take these shapes, a
//! loop past `--max-trip-count`) becomes a refused variant: a run that
//! takes it is refused with the import's error, and `kiln compile` says
//! so.

use crate::error::DriverError;
use kiln_format::{Guard, Role};
use kiln_ir::Graph;
use kiln_onnx::{Branches, OnnxError};
use std::collections::BTreeMap;

/// Most variants (paths) one input shape may have: the model's decisions
/// multiply them, and each is compiled on its own.
pub const MAX_VARIANTS: usize = 64;

/// One profile-to-be of a shape's expansion: a graph to compile with its
/// role, or a refused path.
pub(crate) enum Unit {
    /// A variant or a condition program; guards index this expansion's
    /// units.
    Compiled {
        /// What the label adds to the shape's (`If 'If_0' takes its then
        /// branch: true`).
        label: String,
        graph: Graph,
        role: Role,
    },
    /// A path that does not import; guards index this expansion's units.
    Refused { label: String, role: Role },
}

/// A path: the decisions met, in order, with the value taken at each.
type Path = Vec<(String, bool)>;

/// The variants of one input shape: `import` imports the model with the
/// given branches (`base` with a path). An import that meets no run-time
/// decision is [`Expansion::Single`].
pub(crate) fn expand(
    import: &mut dyn FnMut(&Branches) -> Result<Graph, DriverError>,
    base: &Branches,
) -> Result<Expansion, DriverError> {
    // Depth first, the then-side first: a deterministic order.
    let mut pending: Vec<Path> = vec![Vec::new()];
    let mut words: BTreeMap<String, String> = BTreeMap::new();
    let mut leaves: Vec<(Path, Result<Graph, String>)> = Vec::new();
    while let Some(path) = pending.pop() {
        let branches = Branches {
            taken: path.iter().cloned().collect(),
            ..base.clone()
        };
        match import(&branches) {
            Ok(graph) if path.is_empty() => return Ok(Expansion::Single(graph)),
            Ok(graph) => leaves.push((path, Ok(graph))),
            Err(DriverError::Onnx(OnnxError::Undecided { key, what })) => {
                if leaves.len() + pending.len() + 2 > MAX_VARIANTS {
                    return Ok(Expansion::TooMany(format!(
                        "the model's run-time control flow has more than {MAX_VARIANTS} paths at these shapes (the last decision met: {what}); Kiln compiles each path on its own: bind the inputs the conditions are computed from (--bind-input NAME=FILE.npy), or lower --max-trip-count"
                    )));
                }
                words.insert(key.clone(), what);
                for value in [false, true] {
                    let mut next = path.clone();
                    next.push((key.clone(), value));
                    pending.push(next);
                }
            }
            Err(e) if path.is_empty() => return Err(e),
            Err(e) => leaves.push((path, Err(e.to_string()))),
        }
    }
    if leaves.iter().all(|(_, leaf)| leaf.is_err()) {
        let (path, reason) = &leaves[0];
        return Err(DriverError::Usage(format!(
            "no path of the model's run-time control flow compiles at these shapes; the first ({}) says: {}",
            describe(path, &words),
            reason.as_ref().err().map_or("", String::as_str)
        )));
    }
    // One condition program per decision node: the path before it and
    // the decision, in the order the leaves first need them.
    let mut conditions: Vec<(Path, String)> = Vec::new();
    let mut guards_of = |path: &[(String, bool)]| -> Vec<(usize, bool)> {
        (0..path.len())
            .map(|j| {
                let node = (path[..j].to_vec(), path[j].0.clone());
                let index = match conditions.iter().position(|c| *c == node) {
                    Some(i) => i,
                    None => {
                        conditions.push(node);
                        conditions.len() - 1
                    }
                };
                (index, path[j].1)
            })
            .collect()
    };
    let leaf_guards: Vec<Vec<(usize, bool)>> =
        leaves.iter().map(|(path, _)| guards_of(path)).collect();
    // Units: the compiled variants first (the first of them becomes the
    // shape's first profile), then the condition programs, then the
    // refused paths.
    let compiled = leaves.iter().filter(|(_, l)| l.is_ok()).count();
    let condition_index = |c: usize| (compiled + c) as u32;
    let to_guards = |g: &[(usize, bool)]| -> Vec<Guard> {
        g.iter()
            .map(|&(c, holds)| Guard {
                condition: condition_index(c),
                holds,
            })
            .collect()
    };
    let mut units = Vec::with_capacity(leaves.len() + conditions.len());
    let mut refused = Vec::new();
    for ((path, leaf), guards) in leaves.into_iter().zip(&leaf_guards) {
        let label = describe(&path, &words);
        let guards = to_guards(guards);
        match leaf {
            Ok(graph) => units.push(Unit::Compiled {
                label,
                graph,
                role: Role::Model { guards },
            }),
            Err(reason) => refused.push(Unit::Refused {
                label,
                role: Role::Refused { guards, reason },
            }),
        }
    }
    for (before, key) in conditions {
        let branches = Branches {
            taken: before.iter().cloned().collect(),
            condition_of: Some(key.clone()),
            ..base.clone()
        };
        let graph = import(&branches)?;
        let what = words[&key].clone();
        units.push(Unit::Compiled {
            label: format!("condition: {what}"),
            graph,
            role: Role::Condition { what },
        });
    }
    units.extend(refused);
    Ok(Expansion::Variants(units))
}

/// What one input shape compiles to.
pub(crate) enum Expansion {
    /// The model has no run-time decision at this shape: one graph.
    Single(Graph),
    /// Variants, condition programs and refused paths, in profile order.
    Variants(Vec<Unit>),
    /// More paths than [`MAX_VARIANTS`]: why, for the caller's error
    /// (an import that selects `If` branches with `Where` may still do).
    TooMany(String),
}

/// A path in words: `If 'If_0' takes its then branch: true`, the
/// iterations of one loop counted (`Loop 'L' runs 3 iterations`).
fn describe(path: &[(String, bool)], words: &BTreeMap<String, String>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        let (key, value) = &path[i];
        if let Some((name, _)) = key.split_once(LOOP_ITERATION) {
            // A loop's decisions come one per iteration, in order.
            let prefix = format!("{name}{LOOP_ITERATION}");
            let run = path[i..].iter().take_while(|(k, _)| k.starts_with(&prefix));
            let (mut count, mut ended) = (0, false);
            for (_, runs) in run {
                i += 1;
                match runs {
                    true => count += 1,
                    false => {
                        ended = true;
                        break;
                    }
                }
            }
            let plural = if count == 1 { "" } else { "s" };
            parts.push(match ended {
                true => format!("Loop '{name}' runs {count} iteration{plural}"),
                false => format!("Loop '{name}' runs more than {} iterations", count - 1),
            });
            continue;
        }
        let what = words.get(key).map_or(key.as_str(), String::as_str);
        parts.push(format!("{what}: {value}"));
        i += 1;
    }
    parts.join(", ")
}

/// What separates a loop's name from the iteration in a decision key
/// (`kiln_onnx`'s `Loop` import names them `{loop}#iter{t}`).
const LOOP_ITERATION: &str = "#iter";

#[cfg(test)]
mod tests {
    use super::*;

    /// An import that meets the decisions `order` along every path (a
    /// decision met once its predecessors have values), refusing paths
    /// that `refuse` says no to; the graph is empty.
    fn fake(
        order: &'static [&'static str],
        refuse: fn(&BTreeMap<String, bool>) -> bool,
    ) -> impl FnMut(&Branches) -> Result<Graph, DriverError> {
        move |b: &Branches| {
            for &key in order {
                if b.condition_of.as_deref() == Some(key) {
                    return Ok(Graph::new());
                }
                if !b.taken.contains_key(key) {
                    return Err(DriverError::Onnx(OnnxError::Undecided {
                        key: key.into(),
                        what: format!("If '{key}' takes its then branch"),
                    }));
                }
            }
            match refuse(&b.taken) {
                true => Err(DriverError::Usage("this branch does not import".into())),
                false => Ok(Graph::new()),
            }
        }
    }

    fn roles(units: &[Unit]) -> Vec<(String, Role)> {
        (units.iter())
            .map(|u| match u {
                Unit::Compiled { label, role, .. } | Unit::Refused { label, role } => {
                    (label.clone(), role.clone())
                }
            })
            .collect()
    }

    #[test]
    fn two_decisions_make_four_variants_three_conditions_and_refusals_last() {
        let mut import = fake(&["a", "b"], |t| t["a"] && !t["b"]);
        let Expansion::Variants(units) = expand(&mut import, &Branches::default()).unwrap() else {
            panic!("expected variants");
        };
        let roles = roles(&units);
        let guard = |condition, holds| Guard { condition, holds };
        // Compiled variants (then-side first), the conditions (a, then b
        // after a=true, then b after a=false), the refused path.
        assert_eq!(roles.len(), 4 + 3);
        assert_eq!(
            roles[0].1,
            Role::Model {
                guards: vec![guard(3, true), guard(4, true)]
            }
        );
        assert_eq!(
            roles[1].1,
            Role::Model {
                guards: vec![guard(3, false), guard(5, true)]
            }
        );
        assert!(matches!(&roles[3].1, Role::Condition { what } if what.contains("'a'")));
        assert_eq!(
            roles[6].0,
            "If 'a' takes its then branch: true, If 'b' takes its then branch: false"
        );
        assert!(
            matches!(&roles[6].1, Role::Refused { reason, .. } if reason.contains("does not import"))
        );
    }

    #[test]
    fn no_decision_is_one_graph_and_all_refused_is_an_error() {
        let mut plain = fake(&[], |_| false);
        assert!(matches!(
            expand(&mut plain, &Branches::default()).unwrap(),
            Expansion::Single(_)
        ));
        let mut broken = fake(&["a"], |_| true);
        let e = expand(&mut broken, &Branches::default()).err().unwrap();
        assert!(e.to_string().contains("no path"), "{e}");
    }

    #[test]
    fn loop_paths_read_as_iteration_counts() {
        let words = BTreeMap::new();
        let path: Path = [true, true, false]
            .iter()
            .enumerate()
            .map(|(t, &v)| (format!("L{LOOP_ITERATION}{t}"), v))
            .collect();
        assert_eq!(describe(&path, &words), "Loop 'L' runs 2 iterations");
        let past: Path = vec![(format!("L{LOOP_ITERATION}0"), true)];
        assert_eq!(
            describe(&past, &words),
            "Loop 'L' runs more than 0 iterations"
        );
    }
}
