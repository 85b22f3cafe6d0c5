//! A scope key's log of admissions as Redis holds it, one string
//! (`decide.lua`'s header is the normative layout):
//! `<count: 6 hex digits><index: each entry's time, 12 hex digits of ms,
//! newest first>\n<ids, oldest first, each followed by \n>`; `""` when
//! there is none. The scripts write it; Rust reads it (the snapshot reads
//! only its head, a few bytes at fixed offsets), and writes it once: when
//! `mailgate admin migrate` converts an earlier build's sorted set.

/// The count's digits.
const HEAD: usize = 6;
/// An index entry's digits.
const ENTRY: usize = 12;
/// The most entries a log holds (`decide.lua`'s `MAX_COUNT`).
const MAX_COUNT: usize = 0xFF_FFFF;

/// The bytes at the front of a log that hold its count and its newest `n`
/// entries' times: what a `GETRANGE key 0 <len - 1>` of it must read.
pub(super) fn head_len(n: usize) -> usize {
    HEAD + n * ENTRY
}

/// The byte range (inclusive) of the `n`-th newest entry's time: a
/// `GETRANGE` of it answers that entry's time if the log has `n` entries
/// (its count says), and other bytes if not.
pub(super) fn nth_range(n: usize) -> (usize, usize) {
    let start = HEAD + (n - 1) * ENTRY;
    (start, start + ENTRY - 1)
}

/// What a read of a log's head (`head_len`) holds: its count, and the
/// times of its newest entries (newest first), as many as were read and
/// it has. `None` if the bytes are not a log's.
pub(super) fn head(bytes: &[u8]) -> Option<(usize, Vec<u64>)> {
    if bytes.is_empty() {
        return Some((0, Vec::new()));
    }
    let count = hex(bytes.get(..HEAD)?)? as usize;
    let read = (bytes.len() - HEAD) / ENTRY;
    let times = (0..read.min(count))
        .map(|i| time_at(bytes, i))
        .collect::<Option<Vec<u64>>>()?;
    Some((count, times))
}

/// The head of a log of `count` entries whose newest times (newest
/// first) are `newest`: its first bytes, as `head` read them
/// (`"000000"` for no log). The compare-and-set (`commit.lua`) checks
/// that a log still begins so.
pub(super) fn head_of(count: usize, newest: &[u64]) -> String {
    let mut head = format!("{count:06x}");
    for t in newest {
        head.push_str(&format!("{t:012x}"));
    }
    head
}

/// An entry's time read alone (`nth_range`); `None` unless it is 12 hex
/// digits.
pub(super) fn time(bytes: &[u8]) -> Option<u64> {
    match bytes.len() == ENTRY {
        true => hex(bytes),
        false => None,
    }
}

/// A whole log's entries, newest first: each one's time and id (a kept
/// failure's id ends with `\u{1}`). `None` if the text is not a log.
pub fn entries(text: &[u8]) -> Option<Vec<(u64, String)>> {
    let (count, _) = head(text.get(..head_len(0).min(text.len()))?)?;
    if count == 0 {
        return Some(Vec::new());
    }
    let ids_at = head_len(count) + 1;
    if text.get(ids_at - 1) != Some(&b'\n') {
        return None;
    }
    let ids: Vec<&[u8]> = text.get(ids_at..)?.split(|&b| b == b'\n').collect();
    // Each id is followed by \n: the split ends with an empty piece.
    if ids.len() != count + 1 || ids.last().is_some_and(|last| !last.is_empty()) {
        return None;
    }
    (0..count)
        .map(|i| {
            let id = std::str::from_utf8(ids[count - 1 - i]).ok()?;
            Some((time_at(text, i)?, id.to_owned()))
        })
        .collect()
}

/// The log of `entries` (any order; ordered here by time, newest first,
/// and on a tie in the order given, the later first), as the scripts
/// write it; `None` if there are more than a log holds or an id holds a
/// `\n`.
pub fn encode(entries: &[(u64, String)]) -> Option<Vec<u8>> {
    if entries.is_empty() {
        return Some(Vec::new());
    }
    if entries.len() > MAX_COUNT || entries.iter().any(|(_, id)| id.contains('\n')) {
        return None;
    }
    // Oldest first, stable: a tie keeps the order given.
    let mut sorted: Vec<&(u64, String)> = entries.iter().collect();
    sorted.sort_by_key(|(at, _)| *at);
    let mut out = format!("{:06x}", sorted.len()).into_bytes();
    for (at, _) in sorted.iter().rev() {
        out.extend_from_slice(format!("{at:012x}").as_bytes());
    }
    out.push(b'\n');
    for (_, id) in &sorted {
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    Some(out)
}

/// The i-th newest entry's time (0-based) in a log's bytes.
fn time_at(bytes: &[u8], i: usize) -> Option<u64> {
    let start = head_len(i);
    hex(bytes.get(start..start + ENTRY)?)
}

/// Lowercase hex digits as a number (the scripts write `%x`).
fn hex(digits: &[u8]) -> Option<u64> {
    if !digits
        .iter()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_reads_as_decide_lua_writes_it() {
        // decide.lua's example: j1 at 1790000000000 ms, j2 a second later.
        let text = b"00000201a0c4506fe801a0c4506c00\nj1\nj2\n";
        let lua = include_str!("../../store/scripts/decide.lua");
        assert!(lua.contains(r#""000002" .. "01a0c4506fe8" .. "01a0c4506c00" .. "\nj1\nj2\n""#));
        let got = entries(text).unwrap();
        assert_eq!(
            got,
            vec![
                (1_790_000_001_000, "j2".to_owned()),
                (1_790_000_000_000, "j1".to_owned())
            ]
        );
        assert_eq!(encode(&got).unwrap(), text.to_vec());
        // A tie keeps the order given: the later one first in the index.
        let tie = [(5, "a".to_owned()), (5, "b".to_owned())];
        assert_eq!(entries(&encode(&tie).unwrap()).unwrap()[0].1, "b");
        assert_eq!(entries(b"").unwrap(), vec![]);
        assert_eq!(encode(&[]).unwrap(), Vec::<u8>::new());
        // The head: the count and the newest times that were read.
        assert_eq!(
            head(&text[..head_len(1)]),
            Some((2, vec![1_790_000_001_000]))
        );
        assert_eq!(
            head(&text[..head_len(5).min(text.len())]).unwrap().1.len(),
            2
        );
        // What a compare-and-set finds at the front of the log.
        assert_eq!(head_of(2, &[1_790_000_001_000]), "00000201a0c4506fe8");
        assert!(text.starts_with(head_of(2, &[1_790_000_001_000]).as_bytes()));
        assert_eq!(head_of(0, &[]), "000000");
        let (s, e) = nth_range(2);
        assert_eq!(time(&text[s..=e]), Some(1_790_000_000_000));
        for bad in [&b"zz"[..], b"000002", b"00000101a0c4506fe8j1\n", b"000001x"] {
            assert!(entries(bad).is_none(), "{bad:?}");
        }
        assert!(encode(&[(1, "a\nb".to_owned())]).is_none());
    }
}
