//! Markdown tables as the reports of the benchmarks (`benches/`) and of the
//! fault engine ([`crate::faults::report`]) write them.

use std::fmt::{Display, Write};

/// One row of a Markdown table, newline included: `| a | b | c |`. Each
/// cell is written as it displays (an empty one as `|  |`); a cell with a
/// unit or two figures is formatted by the caller first.
pub fn row(cells: &[&dyn Display]) -> String {
    let mut line = String::from("|");
    for cell in cells {
        // Writing into a String cannot fail.
        let _ = write!(line, " {cell} |");
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::row;

    #[test]
    fn cells_between_bars() {
        assert_eq!(
            row(&[&"a", &1, &format!("{:.1}", 2.0)]),
            "| a | 1 | 2.0 |\n"
        );
        assert_eq!(row(&[&"a", &""]), "| a |  |\n");
    }
}
