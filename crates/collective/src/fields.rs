//! Keys from fields of text records (`tessera collect --key 3,4n`): byte strings whose byte
//! order is the order the fields describe, text fields bytewise (as `LC_ALL=C sort`), number
//! fields numerically.

use std::str::FromStr;

/// Which fields make the key, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    fields: Vec<Field>,
    /// The field separator; `None`: runs of spaces and tabs.
    sep: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    /// From 0.
    index: usize,
    numeric: bool,
}

impl FromStr for KeySpec {
    type Err = String;

    /// `3,4n`: field 3 as text, then field 4 as a number (fields count from 1).
    fn from_str(s: &str) -> Result<Self, String> {
        let fields = s
            .split(',')
            .map(|f| {
                let (num, numeric) = match f.strip_suffix('n') {
                    Some(n) => (n, true),
                    None => (f, false),
                };
                match num.parse::<usize>() {
                    Ok(i) if i >= 1 => Ok(Field {
                        index: i - 1,
                        numeric,
                    }),
                    _ => Err(format!(
                        "bad key field {f:?} in {s:?}: fields count from 1, `n` after one makes it numeric (e.g. 3,4n)"
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { fields, sep: None })
    }
}

impl KeySpec {
    /// Field 1 as text: the default key of fixed-size records.
    #[must_use]
    pub fn default_field() -> Self {
        Self {
            fields: vec![Field {
                index: 0,
                numeric: false,
            }],
            sep: None,
        }
    }

    /// Fields separated by exactly `sep` (a tab: `b'\t'`) instead of runs of blanks.
    #[must_use]
    pub fn with_separator(mut self, sep: Option<u8>) -> Self {
        self.sep = sep;
        self
    }

    /// Field `index` (from 0) of `line`.
    fn field<'a>(&self, line: &'a [u8], index: usize) -> Option<&'a [u8]> {
        match self.sep {
            Some(c) => line.split(|&b| b == c).nth(index),
            None => line
                .split(|&b| b == b' ' || b == b'\t' || b == b'\n')
                .filter(|f| !f.is_empty())
                .nth(index),
        }
    }

    /// How many fields make the key.
    #[must_use]
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The whole number (decimal, blanks around it ignored) in the first key field of
    /// `record`: the key of a fixed-size record.
    #[must_use]
    pub fn integer(&self, record: &[u8]) -> Option<u64> {
        let f = self.field(record, self.fields.first()?.index)?;
        std::str::from_utf8(f).ok()?.trim().parse().ok()
    }

    /// Appends the key of `line` (without its newline) to `out`.
    pub fn key(&self, line: &[u8], out: &mut Vec<u8>) {
        for f in &self.fields {
            let field = self.field(line, f.index);
            if f.numeric {
                let n = field
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .filter(|n| !n.is_nan());
                number_key(out, n);
            } else {
                text_key(out, field.unwrap_or_default());
            }
        }
    }
}

/// A text field: its bytes, each 0 written as 0 0xff, then 0 0 (so a field that is a prefix
/// of another sorts first whatever follows it).
pub fn text_key(out: &mut Vec<u8>, field: &[u8]) {
    for &b in field {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// A number field: 1 and the number's 8 bytes in an order-preserving form; a missing or
/// unreadable number is 0 alone, first. Integers beyond 2^53 compare as their nearest
/// 64-bit float.
pub fn number_key(out: &mut Vec<u8>, n: Option<f64>) {
    let Some(n) = n else {
        out.push(0);
        return;
    };
    let bits = (n + 0.0).to_bits(); // -0 as 0
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    out.push(1);
    out.extend_from_slice(&ordered.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(spec: &str, line: &str) -> Vec<u8> {
        let mut out = Vec::new();
        spec.parse::<KeySpec>()
            .unwrap()
            .key(line.as_bytes(), &mut out);
        out
    }

    #[test]
    fn specs_parse() {
        assert!("3,4n".parse::<KeySpec>().is_ok());
        for bad in ["", "0", "x", "3,", "n", "4m"] {
            assert!(bad.parse::<KeySpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sam_lines_sort_by_reference_then_position() {
        let lines = [
            "r1\t0\tchr2\t100\t60",
            "r2\t0\tchr1\t9000\t60",
            "r3\t0\tchr1\t99\t60",
            "r4\t0\tchr10\t5\t60",
            "@HD\tVN:1.6",
        ];
        let mut sorted: Vec<&str> = lines.to_vec();
        sorted.sort_by_key(|l| key("3,4n", l));
        assert_eq!(
            sorted,
            [
                "@HD\tVN:1.6",
                "r3\t0\tchr1\t99\t60",
                "r2\t0\tchr1\t9000\t60",
                "r4\t0\tchr10\t5\t60",
                "r1\t0\tchr2\t100\t60"
            ]
        );
    }

    #[test]
    fn whole_numbers_key_fixed_size_records() {
        let spec = "2".parse::<KeySpec>().unwrap();
        assert_eq!(spec.integer(b"x 42   \n"), Some(42));
        assert_eq!(spec.integer(b"x -1\n"), None);
        assert_eq!(spec.integer(b"x"), None);
        let tab = spec.with_separator(Some(b'\t'));
        assert_eq!(tab.integer(b"a\t 7 \tb"), Some(7));
    }

    #[test]
    fn an_explicit_separator_keeps_empty_fields() {
        let spec = "2".parse::<KeySpec>().unwrap().with_separator(Some(b','));
        let mut a = Vec::new();
        spec.key(b"x,,b", &mut a);
        assert_eq!(a, [0, 0]);
    }

    proptest! {
        #[test]
        fn number_keys_order_as_numbers(a in any::<f64>(), b in any::<f64>()) {
            prop_assume!(!a.is_nan() && !b.is_nan());
            let (mut ka, mut kb) = (Vec::new(), Vec::new());
            number_key(&mut ka, Some(a));
            number_key(&mut kb, Some(b));
            prop_assert_eq!(ka.cmp(&kb), a.partial_cmp(&b).unwrap());
        }

        #[test]
        fn text_keys_of_two_fields_order_field_by_field(
            a in prop::collection::vec((prop::collection::vec(0u8..3, 0..4), prop::collection::vec(0u8..3, 0..4)), 2),
        ) {
            let k = |(x, y): &(Vec<u8>, Vec<u8>)| {
                let mut out = Vec::new();
                text_key(&mut out, x);
                text_key(&mut out, y);
                out
            };
            prop_assert_eq!(k(&a[0]).cmp(&k(&a[1])), a[0].cmp(&a[1]));
        }
    }
}
