// A small parser for Structured Field lists ([RFC 9651]), enough to read the `RateLimit`
// field: every syntax the RFC defines is recognised and validated, so that a field
// that is not a valid List is rejected whole, as section 4.2 of the RFC requires; only
// what the hint readers need is kept (the kind of each bare item, integers as numbers,
// the raw text of strings and tokens).
//
// Nothing here allocates per byte or panics: the input is read through [`Cursor`],
// which never indexes out of bounds, and numbers are bounded by the RFC's own limits
// (at most 15 digits) long before an `i64` could overflow.
//
// [RFC 9651]: https://www.rfc-editor.org/rfc/rfc9651

/// A bare item. Strings, tokens, byte sequences and display strings keep their text as it
/// appears in the field (escapes not resolved), which is all the hint readers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bare<'a> {
    /// An Integer, within +/- 999,999,999,999,999.
    Integer(i64),
    /// A Decimal, in thousandths (the RFC allows at most three fractional digits).
    Decimal(i64),
    /// A String: the text between the quotes, escapes still in place.
    String(&'a str),
    /// A Token.
    Token(&'a str),
    /// A Byte Sequence: the base64 text between the colons.
    ByteSequence(&'a str),
    /// A Boolean.
    Boolean(bool),
    /// A Date (RFC 9651): seconds since 1970.
    Date(i64),
    /// A Display String (RFC 9651): the text between the quotes, percent escapes still in
    /// place (they were checked to decode to UTF-8).
    DisplayString(&'a str),
}

/// An Item: a bare item and its parameters, in the order they first appeared, each key
/// once with the last value given for it (RFC 9651, section 4.2.3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item<'a> {
    pub(crate) bare: Bare<'a>,
    pub(crate) params: Vec<(&'a str, Bare<'a>)>,
}

impl<'a> Item<'a> {
    /// The value of parameter `key`, if the item has it.
    pub(crate) fn param(&self, key: &str) -> Option<Bare<'a>> {
        self.params
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| *value)
    }
}

/// A member of a List.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Member<'a> {
    /// A single Item.
    Item(Item<'a>),
    /// An Inner List, validated but not kept: no hint reader uses one.
    InnerList,
}

/// Parses `input` as the value of a List field.
///
/// `input` is the field value with its field lines already combined (joined by `", "`);
/// spaces before and after the list are allowed. `None` when the value is not a valid
/// List. An empty value is the empty list.
pub(crate) fn parse_list(input: &[u8]) -> Option<Vec<Member<'_>>> {
    let mut cursor = Cursor::new(input);
    cursor.skip_sp();
    let mut members = Vec::new();
    while !cursor.is_empty() {
        members.push(member(&mut cursor)?);
        cursor.skip_ows();
        if cursor.is_empty() {
            break;
        }
        if cursor.bump()? != b',' {
            return None;
        }
        cursor.skip_ows();
        if cursor.is_empty() {
            // A trailing comma.
            return None;
        }
    }
    Some(members)
}

/// Reads the input one byte at a time; every access is checked.
struct Cursor<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(input: &'a [u8]) -> Self {
        Self { input, pos: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(byte)
    }

    /// Consumes the next byte when it is `expected`.
    fn eat(&mut self, expected: u8) -> bool {
        let found = self.peek() == Some(expected);
        if found {
            self.pos += 1;
        }
        found
    }

    /// Consumes bytes while `keep` holds and returns them.
    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a [u8] {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.input.get(start..self.pos).unwrap_or_default()
    }

    /// The text from `start` to the current position. Only ever called on spans made of
    /// checked ASCII, so the conversion cannot fail; `None` all the same if it did.
    fn text_from(&self, start: usize) -> Option<&'a str> {
        std::str::from_utf8(self.input.get(start..self.pos)?).ok()
    }

    fn skip_sp(&mut self) {
        self.take_while(|byte| byte == b' ');
    }

    fn skip_ows(&mut self) {
        self.take_while(|byte| byte == b' ' || byte == b'\t');
    }
}

fn member<'a>(cursor: &mut Cursor<'a>) -> Option<Member<'a>> {
    if cursor.peek() == Some(b'(') {
        inner_list(cursor)?;
        Some(Member::InnerList)
    } else {
        item(cursor).map(Member::Item)
    }
}

fn inner_list(cursor: &mut Cursor<'_>) -> Option<()> {
    if !cursor.eat(b'(') {
        return None;
    }
    loop {
        cursor.skip_sp();
        if cursor.eat(b')') {
            parameters(cursor)?;
            return Some(());
        }
        // Runs out of input here when the list is never closed.
        item(cursor)?;
        match cursor.peek()? {
            b' ' | b')' => {}
            _ => return None,
        }
    }
}

fn item<'a>(cursor: &mut Cursor<'a>) -> Option<Item<'a>> {
    let bare = bare_item(cursor)?;
    let params = parameters(cursor)?;
    Some(Item { bare, params })
}

fn parameters<'a>(cursor: &mut Cursor<'a>) -> Option<Vec<(&'a str, Bare<'a>)>> {
    let mut params: Vec<(&'a str, Bare<'a>)> = Vec::new();
    while cursor.eat(b';') {
        cursor.skip_sp();
        let name = key(cursor)?;
        let value = if cursor.eat(b'=') {
            bare_item(cursor)?
        } else {
            Bare::Boolean(true)
        };
        match params.iter_mut().find(|(known, _)| *known == name) {
            Some(slot) => slot.1 = value,
            None => params.push((name, value)),
        }
    }
    Some(params)
}

fn key<'a>(cursor: &mut Cursor<'a>) -> Option<&'a str> {
    let start = cursor.pos;
    match cursor.peek()? {
        b'a'..=b'z' | b'*' => {}
        _ => return None,
    }
    cursor.take_while(|byte| matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'));
    cursor.text_from(start)
}

fn bare_item<'a>(cursor: &mut Cursor<'a>) -> Option<Bare<'a>> {
    match cursor.peek()? {
        b'-' | b'0'..=b'9' => number(cursor),
        b'"' => string(cursor).map(Bare::String),
        b'A'..=b'Z' | b'a'..=b'z' | b'*' => token(cursor).map(Bare::Token),
        b':' => byte_sequence(cursor).map(Bare::ByteSequence),
        b'?' => boolean(cursor).map(Bare::Boolean),
        b'@' => date(cursor).map(Bare::Date),
        b'%' => display_string(cursor).map(Bare::DisplayString),
        _ => None,
    }
}

/// An Integer or a Decimal (RFC 9651, section 4.2.4).
fn number<'a>(cursor: &mut Cursor<'a>) -> Option<Bare<'a>> {
    let negative = cursor.eat(b'-');
    let integer = cursor.take_while(|byte| byte.is_ascii_digit());
    if integer.is_empty() {
        return None;
    }
    let sign = if negative { -1 } else { 1 };
    if !cursor.eat(b'.') {
        if integer.len() > 15 {
            return None;
        }
        return Some(Bare::Integer(sign * digits_value(integer)));
    }
    let fraction = cursor.take_while(|byte| byte.is_ascii_digit());
    if integer.len() > 12 || fraction.is_empty() || fraction.len() > 3 {
        return None;
    }
    // Scale the fraction to thousandths: "5" is 500, "25" is 250.
    let scale = 10_i64.pow(3 - u32::try_from(fraction.len()).ok()?);
    let thousandths = digits_value(integer) * 1000 + digits_value(fraction) * scale;
    Some(Bare::Decimal(sign * thousandths))
}

/// The value of at most 15 ASCII digits.
fn digits_value(digits: &[u8]) -> i64 {
    digits
        .iter()
        .fold(0, |total, digit| total * 10 + i64::from(digit - b'0'))
}

/// A String (RFC 9651, section 4.2.5): visible ASCII and spaces between quotes, with `\"`
/// and `\\` the only escapes.
fn string<'a>(cursor: &mut Cursor<'a>) -> Option<&'a str> {
    if !cursor.eat(b'"') {
        return None;
    }
    let start = cursor.pos;
    loop {
        match cursor.bump()? {
            b'\\' => match cursor.bump()? {
                b'"' | b'\\' => {}
                _ => return None,
            },
            b'"' => {
                let end = cursor.pos - 1;
                return std::str::from_utf8(cursor.input.get(start..end)?).ok();
            }
            b' '..=b'~' => {}
            _ => return None,
        }
    }
}

/// A Token (RFC 9651, section 4.2.6).
fn token<'a>(cursor: &mut Cursor<'a>) -> Option<&'a str> {
    let start = cursor.pos;
    match cursor.bump()? {
        b'A'..=b'Z' | b'a'..=b'z' | b'*' => {}
        _ => return None,
    }
    cursor.take_while(|byte| is_tchar(byte) || byte == b':' || byte == b'/');
    cursor.text_from(start)
}

/// RFC 9110's `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// A Byte Sequence (RFC 9651, section 4.2.7): base64 between colons. The content is
/// checked to be decodable (the alphabet, padding only at the end, no impossible length)
/// but not decoded; missing padding and non-zero pad bits are accepted, as the RFC asks.
fn byte_sequence<'a>(cursor: &mut Cursor<'a>) -> Option<&'a str> {
    if !cursor.eat(b':') {
        return None;
    }
    let start = cursor.pos;
    let content = cursor.take_while(|byte| byte != b':');
    let text = cursor.text_from(start)?;
    if !cursor.eat(b':') {
        return None;
    }
    let data_len = content.iter().take_while(|byte| **byte != b'=').count();
    let (data, padding) = content.split_at(data_len);
    let well_formed = data
        .iter()
        .all(|byte| byte.is_ascii_alphanumeric() || *byte == b'+' || *byte == b'/')
        && padding.iter().all(|byte| *byte == b'=')
        && padding.len() <= 2
        && data.len() % 4 != 1
        && (padding.is_empty() || (data.len() + padding.len()) % 4 == 0);
    well_formed.then_some(text)
}

/// A Boolean (RFC 9651, section 4.2.8): `?1` or `?0`.
fn boolean(cursor: &mut Cursor<'_>) -> Option<bool> {
    if !cursor.eat(b'?') {
        return None;
    }
    match cursor.bump()? {
        b'1' => Some(true),
        b'0' => Some(false),
        _ => None,
    }
}

/// A Date (RFC 9651, section 4.2.9): `@` and an Integer.
fn date(cursor: &mut Cursor<'_>) -> Option<i64> {
    if !cursor.eat(b'@') {
        return None;
    }
    match number(cursor)? {
        Bare::Integer(seconds) => Some(seconds),
        _ => None,
    }
}

/// A Display String (RFC 9651, section 4.2.10): `%"`, visible ASCII and spaces with
/// `%xx` escapes in lowercase hex, `"`; the escaped bytes must be UTF-8.
fn display_string<'a>(cursor: &mut Cursor<'a>) -> Option<&'a str> {
    if !(cursor.eat(b'%') && cursor.eat(b'"')) {
        return None;
    }
    let start = cursor.pos;
    let mut decoded = Vec::new();
    loop {
        match cursor.bump()? {
            b'%' => {
                let high = lower_hex(cursor.bump()?)?;
                let low = lower_hex(cursor.bump()?)?;
                decoded.push((high << 4) | low);
            }
            b'"' => {
                std::str::from_utf8(&decoded).ok()?;
                let end = cursor.pos - 1;
                return std::str::from_utf8(cursor.input.get(start..end)?).ok();
            }
            byte @ b' '..=b'~' => decoded.push(byte),
            _ => return None,
        }
    }
}

fn lower_hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(input: &str) -> Vec<Item<'_>> {
        parse_list(input.as_bytes())
            .unwrap_or_else(|| panic!("{input:?} is a valid list"))
            .into_iter()
            .filter_map(|member| match member {
                Member::Item(item) => Some(item),
                Member::InnerList => None,
            })
            .collect()
    }

    fn one(input: &str) -> Item<'_> {
        let mut all = items(input);
        assert_eq!(all.len(), 1, "{input:?}");
        all.remove(0)
    }

    fn invalid(input: &str) {
        assert_eq!(
            parse_list(input.as_bytes()),
            None,
            "{input:?} must be rejected"
        );
    }

    #[test]
    fn empty_and_blank_values_are_the_empty_list() {
        assert_eq!(parse_list(b""), Some(Vec::new()));
        assert_eq!(parse_list(b"   "), Some(Vec::new()));
    }

    #[test]
    fn integers_within_fifteen_digits() {
        assert_eq!(one("0").bare, Bare::Integer(0));
        assert_eq!(one("-42").bare, Bare::Integer(-42));
        assert_eq!(one("007").bare, Bare::Integer(7));
        assert_eq!(
            one("999999999999999").bare,
            Bare::Integer(999_999_999_999_999)
        );
        assert_eq!(
            one("-999999999999999").bare,
            Bare::Integer(-999_999_999_999_999)
        );
        invalid("1000000000000000");
        invalid("-");
        invalid("-a");
        invalid("+1");
        invalid("1a");
    }

    #[test]
    fn decimals_in_thousandths() {
        assert_eq!(one("1.5").bare, Bare::Decimal(1500));
        assert_eq!(one("-0.25").bare, Bare::Decimal(-250));
        assert_eq!(one("2.125").bare, Bare::Decimal(2125));
        assert_eq!(
            one("999999999999.999").bare,
            Bare::Decimal(999_999_999_999_999)
        );
        invalid("1.");
        invalid("1.2345");
        invalid("1234567890123.1");
        invalid(".5");
        invalid("1.2.3");
    }

    #[test]
    fn strings_with_escapes() {
        assert_eq!(one(r#""default""#).bare, Bare::String("default"));
        assert_eq!(one(r#""""#).bare, Bare::String(""));
        assert_eq!(one(r#""a \"b\" \\c""#).bare, Bare::String(r#"a \"b\" \\c"#));
        assert_eq!(one(r#""with, comma""#).bare, Bare::String("with, comma"));
        invalid(r#""unterminated"#);
        invalid(r#""bad \n escape""#);
        invalid("\"tab\tinside\"");
        invalid("\"caf\u{e9}\"");
        invalid(r#""trailing backslash\"#);
    }

    #[test]
    fn tokens() {
        assert_eq!(one("default").bare, Bare::Token("default"));
        assert_eq!(one("*").bare, Bare::Token("*"));
        assert_eq!(
            one("a:b/c!#$%&'*+-.^_`|~9").bare,
            Bare::Token("a:b/c!#$%&'*+-.^_`|~9")
        );
        invalid("_leading");
        invalid("tok\"en");
    }

    #[test]
    fn byte_sequences() {
        assert_eq!(one(":aGVsbG8=:").bare, Bare::ByteSequence("aGVsbG8="));
        assert_eq!(one(":aGVsbG8:").bare, Bare::ByteSequence("aGVsbG8"));
        assert_eq!(one("::").bare, Bare::ByteSequence(""));
        invalid(":aGVsbG8");
        invalid(":a:");
        invalid(":ab=c:");
        invalid(":abc===:");
        invalid(":a b:");
        invalid(":ab=:");
    }

    #[test]
    fn booleans_dates_and_display_strings() {
        assert_eq!(one("?1").bare, Bare::Boolean(true));
        assert_eq!(one("?0").bare, Bare::Boolean(false));
        invalid("?2");
        invalid("?");
        assert_eq!(one("@1659578233").bare, Bare::Date(1_659_578_233));
        assert_eq!(one("@-1").bare, Bare::Date(-1));
        invalid("@1.5");
        invalid("@");
        assert_eq!(
            one(r#"%"f%c3%bc%c3%bcr""#).bare,
            Bare::DisplayString("f%c3%bc%c3%bcr")
        );
        invalid(r#"%"bad %C3%BC uppercase""#);
        invalid(r#"%"not utf-8 %ff""#);
        invalid(r#"%"cut %c""#);
        invalid(r#"%no-quote"#);
    }

    #[test]
    fn parameters_take_the_last_value_of_a_key() {
        let item = one(r#""default";r=0;t=30;r=5;flag;s="x";d=1.5"#);
        assert_eq!(item.bare, Bare::String("default"));
        assert_eq!(item.param("r"), Some(Bare::Integer(5)));
        assert_eq!(item.param("t"), Some(Bare::Integer(30)));
        assert_eq!(item.param("flag"), Some(Bare::Boolean(true)));
        assert_eq!(item.param("s"), Some(Bare::String("x")));
        assert_eq!(item.param("d"), Some(Bare::Decimal(1500)));
        assert_eq!(item.param("missing"), None);
        let keys: Vec<&str> = item.params.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, ["r", "t", "flag", "s", "d"]);
    }

    #[test]
    fn parameter_spacing_and_keys() {
        // Spaces may follow `;` but not precede it, and never surround `=`.
        assert_eq!(one("a; r=1").param("r"), Some(Bare::Integer(1)));
        invalid("a ;r=1");
        invalid("a;r =1");
        invalid("a;r= 1");
        invalid("a;R=1");
        invalid("a;1r=1");
        assert_eq!(
            one("a;*k.e-y_9=1").param("*k.e-y_9"),
            Some(Bare::Integer(1))
        );
        invalid("a;r=");
        invalid("a;");
    }

    #[test]
    fn list_separators_and_whitespace() {
        assert_eq!(items("a, b,c ,\td").len(), 4);
        assert_eq!(items("  a  ").len(), 1);
        invalid("a,");
        invalid("a, ");
        invalid(",a");
        invalid("a,,b");
        invalid("a b");
        invalid("a;");
    }

    #[test]
    fn inner_lists_are_validated_and_skipped() {
        let members = parse_list(br#"( "a" b 1 );p=1, x"#).expect("valid");
        assert_eq!(members.len(), 2);
        assert_eq!(members[0], Member::InnerList);
        assert_eq!(parse_list(b"()").expect("valid"), [Member::InnerList]);
        invalid("(a b");
        invalid("(a,b)");
        invalid("(a)b");
        invalid("((a))");
    }

    #[test]
    fn bytes_outside_the_syntax_are_rejected() {
        invalid("\u{7f}");
        invalid("a\u{0}");
        assert_eq!(parse_list(b"\xff"), None);
        assert_eq!(parse_list(b"\"a\xffb\""), None);
        invalid("!");
    }
}
