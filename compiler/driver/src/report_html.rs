//! The accuracy report of a reduced-precision build as one self-contained
//! HTML page (`kiln compile --report report.html`): the graph outputs'
//! errors, a plot of every dense layer's SQNR along the network, and the
//! layers in network order with their precision, the reason, and their
//! errors. No scripts, no external files: inline CSS and SVG only.

use kiln_passes::PrecisionOutcome;
use kiln_passes::{LayerError, Precision};
use std::fmt::Write as _;

/// Signal-to-quantization-noise ratio in dB from a relative L2 error
/// (`∞` for an exact layer, shown as such).
fn sqnr_db(rel_l2: f64) -> f64 {
    if rel_l2 > 0.0 {
        -20.0 * rel_l2.log10()
    } else {
        f64::INFINITY
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_db(db: f64) -> String {
    if db.is_finite() {
        format!("{db:.1}")
    } else {
        "∞".into()
    }
}

fn color(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "#777777",
        Precision::Bf16 => "#1f77b4",
        Precision::Fp16 => "#d62728",
        Precision::Int8 => "#2ca02c",
    }
}

/// The page for the build of `model`; with `coverage` (`--validate`, and
/// the clipped share that warns), its table beside the error chart.
pub fn precision_html(
    model: &str,
    p: &PrecisionOutcome,
    coverage: Option<(&crate::Validated, f64)>,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Kiln precision report: {m}</title>\n\
         <style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}th{{background:#f3f3f3}}\
         td.n{{text-align:right;font-family:monospace}}tr.worst td{{background:#fff3cd}}\
         .k{{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}}</style></head><body>\n\
         <h1>Precision report</h1>\n<p>Model <code>{m}</code>.</p>\n",
        m = escape(model)
    );
    let Some(r) = &p.report else {
        h.push_str(
            "<p>No errors were measured (built with <code>--calibrate-random 0</code>).</p>",
        );
        h.push_str(&decisions_table(p, None));
        h.push_str("</body></html>\n");
        return h;
    };
    let _ = writeln!(
        h,
        "<p>Every dense layer and graph output compared with the fp32 graph on {} {} sample(s){}.\
         SQNR = −20·log<sub>10</sub>(relative L2 error).</p>",
        r.samples,
        if r.random { "random" } else { "calibration" },
        if r.random {
            " (random inputs: errors on real data can differ; use <code>--calibrate DIR</code>)"
        } else {
            ""
        }
    );
    h.push_str("<h2>Graph outputs</h2>\n<table><tr><th>output</th><th>rel. L2</th><th>SQNR dB</th><th>cosine</th><th>max abs</th></tr>\n");
    for o in &r.outputs {
        h.push_str(&error_cells(&o.node, o, ""));
    }
    h.push_str("</table>\n<h2>Error along the network</h2>\n");
    h.push_str(&plot(p, &r.layers));
    if let Some((v, warn)) = coverage {
        h.push_str(&coverage_table(v, warn));
    }
    h.push_str(&decisions_table(p, Some(&r.layers)));
    h.push_str("</body></html>\n");
    h
}

/// The calibration coverage on the held-out samples: per output the int8
/// build against fp32, per int8 layer its clipped share (rows over `warn`
/// highlighted), largest overshoot and the samples that clipped.
fn coverage_table(v: &crate::Validated, warn: f64) -> String {
    let c = &v.coverage;
    let mut h = format!(
        "<h2>Calibration coverage</h2>\n<p>{} held-out sample(s) (<code>--validate</code>) run \
         through the fp32 graph: the share of each int8 layer's activation values outside \
         its calibrated range (clipped); rows over {:.3}% are highlighted.</p>\n\
         <table><tr><th>output</th><th>rel. L2</th><th>cosine</th><th>argmax agreement</th></tr>\n",
        c.samples,
        100.0 * warn
    );
    for o in &c.outputs {
        let argmax = o
            .argmax_agreement
            .map_or("–".to_string(), |a| format!("{:.2}%", 100.0 * a));
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=n>{:.3e}</td><td class=n>{:.6}</td><td class=n>{argmax}</td></tr>",
            escape(&o.output),
            o.rel_l2,
            o.cosine
        );
    }
    h.push_str("</table>\n<table><tr><th>int8 layer</th><th>range</th><th>clipped</th><th>largest overshoot</th><th>samples</th></tr>\n");
    for l in &c.layers {
        let class = if l.clipped_share() > warn {
            "worst"
        } else {
            ""
        };
        let samples: Vec<String> = (l.samples.iter())
            .map(|&i| escape(&crate::report::sample_name(v, i)))
            .collect();
        let _ = writeln!(
            h,
            "<tr class=\"{class}\"><td>{}</td><td class=n>[{:.4}, {:.4}]</td><td class=n>{:.3}%</td><td class=n>{:.4}</td><td>{}</td></tr>",
            escape(&l.node),
            l.range.0,
            l.range.1,
            100.0 * l.clipped_share(),
            l.max_overshoot,
            samples.join(", ")
        );
    }
    h.push_str("</table>\n");
    h
}

fn error_cells(name: &str, e: &LayerError, class: &str) -> String {
    format!(
        "<tr class=\"{class}\"><td>{}</td><td class=n>{:.3e}</td><td class=n>{}</td><td class=n>{:.6}</td><td class=n>{:.3e}</td></tr>\n",
        escape(name),
        e.rel_l2,
        fmt_db(sqnr_db(e.rel_l2)),
        e.cosine,
        e.max_abs
    )
}

/// Layers in network order (the decisions' order) with their errors; the
/// three worst highlighted.
fn decisions_table(p: &PrecisionOutcome, layers: Option<&[LayerError]>) -> String {
    let worst: Vec<&str> = layers
        .unwrap_or(&[])
        .iter()
        .take(3)
        .map(|l| l.node.as_str())
        .collect();
    let mut h = String::from(
        "<h2>Dense layers in network order</h2>\n<table><tr><th>#</th><th>node</th><th>op</th><th>precision</th><th>why</th>\
         <th>rel. L2</th><th>SQNR dB</th><th>cosine</th><th>max abs</th></tr>\n",
    );
    for (i, d) in p.decisions.iter().enumerate() {
        let e = layers.and_then(|ls| ls.iter().find(|l| l.node == d.node));
        let class = if worst.contains(&d.node.as_str()) {
            "worst"
        } else {
            ""
        };
        let _ = write!(
            h,
            "<tr class=\"{class}\"><td class=n>{i}</td><td>{}</td><td>{}</td><td style=\"color:{}\">{}</td><td>{}</td>",
            escape(&d.node),
            d.op,
            color(d.precision),
            d.precision,
            escape(&d.reason.to_string())
        );
        match e {
            Some(e) => {
                let _ = writeln!(
                    h,
                    "<td class=n>{:.3e}</td><td class=n>{}</td><td class=n>{:.6}</td><td class=n>{:.3e}</td></tr>",
                    e.rel_l2,
                    fmt_db(sqnr_db(e.rel_l2)),
                    e.cosine,
                    e.max_abs
                );
            }
            None => h.push_str("<td></td><td></td><td></td><td></td></tr>\n"),
        }
    }
    h.push_str("</table>\n");
    h
}

/// An SVG line of each layer's SQNR in network order, points coloured by
/// precision, the node name in each point's tooltip.
fn plot(p: &PrecisionOutcome, layers: &[LayerError]) -> String {
    let points: Vec<(usize, &str, Precision, f64)> = p
        .decisions
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let e = layers.iter().find(|l| l.node == d.node)?;
            Some((i, d.node.as_str(), d.precision, sqnr_db(e.rel_l2)))
        })
        .collect();
    let finite: Vec<f64> = points
        .iter()
        .map(|p| p.3)
        .filter(|v| v.is_finite())
        .collect();
    if points.is_empty() {
        return String::new();
    }
    let (w, ht, pad) = (760.0, 260.0, 48.0);
    let top = finite.iter().copied().fold(f64::MIN, f64::max).max(1.0);
    let top = (top / 10.0).ceil() * 10.0 + 10.0;
    let n = p.decisions.len().max(2) as f64;
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / (n - 1.0);
    let y = |db: f64| {
        let db = if db.is_finite() { db.min(top) } else { top };
        ht - pad + (db / top) * -(ht - 2.0 * pad)
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{ht}\" font-size=\"11\">\n\
         <line x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"#999\"/>\n\
         <text x=\"{tx}\" y=\"{ty}\" text-anchor=\"middle\">dense layer (network order)</text>\n\
         <text x=\"12\" y=\"{my}\" transform=\"rotate(-90 12 {my})\" text-anchor=\"middle\">SQNR dB (higher is better)</text>\n",
        b = ht - pad,
        r = w - pad,
        tx = w / 2.0,
        ty = ht - 12.0,
        my = ht / 2.0
    );
    let steps = 4;
    for k in 0..=steps {
        let db = top * k as f64 / steps as f64;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{db:.0}</text><line x1=\"{pad}\" y1=\"{yy}\" x2=\"{}\" y2=\"{yy}\" stroke=\"#eee\"/>",
            pad - 4.0,
            y(db) + 4.0,
            w - pad,
            yy = y(db)
        );
    }
    let path: Vec<String> = points
        .iter()
        .map(|&(i, _, _, db)| format!("{:.1},{:.1}", x(i), y(db)))
        .collect();
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#bbb\" points=\"{}\"/>",
        path.join(" ")
    );
    for &(i, node, prec, db) in &points {
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\"><title>{} ({prec}): {} dB</title></circle>",
            x(i),
            y(db),
            color(prec),
            escape(node),
            fmt_db(db)
        );
    }
    s.push_str("</svg>\n<p>");
    for prec in [
        Precision::Fp32,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Int8,
    ] {
        let _ = write!(
            s,
            "<span class=\"k\" style=\"background:{}\"></span>{prec}",
            color(prec)
        );
    }
    s.push_str("</p>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqnr_and_escaping() {
        assert!((sqnr_db(1e-3) - 60.0).abs() < 1e-9);
        assert!(sqnr_db(0.0).is_infinite());
        assert_eq!(escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }
}
