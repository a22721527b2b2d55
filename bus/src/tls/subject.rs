//! Whose a certificate is: the common name (CN) of its subject, read from
//! its DER (RFC 5280: `tbsCertificate` → `subject`, a `SEQUENCE` of sets
//! of attribute type and value), so an agent refuses at start a device
//! certificate made out to another identity. The broker takes the CN as
//! the MQTT user name, and the ACL gives each user only its own topics:
//! with another device's certificate, every publish would be dropped
//! (and still acknowledged) and every command subscription denied.
//!
//! Glossary:
//! - *subject*: the name a certificate is made out to.
//! - *CN*: common name (attribute type 2.5.4.3), the part of the subject
//!   the broker takes as the user name; the first one where there are
//!   several, as mosquitto takes it.
//! - *string type*: how a CN's text is encoded (UTF8String,
//!   PrintableString, TeletexString, BMPString, …); one whose bytes are
//!   not its text as the broker takes them (BMPString, UniversalString),
//!   or that this does not read, is named in the refusal.

use super::validity::{element, names_and_validity};

/// The DER of the attribute type `commonName`, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The first CN of the subject of the certificate `der`, as text; the
/// error says why none reads: not a certificate this reads, no CN in its
/// subject, or a CN [`directory_string`] does not read (its string type
/// named).
pub fn common_name(der: &[u8]) -> Result<String, String> {
    let unread = || "is not a certificate whose subject can be read".to_string();
    let (_, _, subject) = names_and_validity(der).ok_or_else(unread)?;
    let mut sets = subject;
    while !sets.is_empty() {
        let (set, after) = element(sets, 0x31).ok_or_else(unread)?;
        sets = after;
        let mut attributes = set;
        while !attributes.is_empty() {
            let (attribute, after) = element(attributes, 0x30).ok_or_else(unread)?;
            attributes = after;
            let (oid, value) = element(attribute, 0x06).ok_or_else(unread)?;
            if oid == COMMON_NAME {
                return directory_string(value).map_err(|why| format!("has a CN that {why}"));
            }
        }
    }
    Err("has no CN in its subject".into())
}

/// The text of an X.520 directory string (a CN's value) `value`, tag
/// first, read only where its bytes are that text, as a broker taking the
/// CN as the login takes them: UTF8String; PrintableString, IA5String,
/// NumericString and VisibleString (ASCII); TeletexString when its bytes
/// are ASCII. A BMPString, a UniversalString or a TeletexString past
/// ASCII is refused, naming it (the broker would refuse the login); so is
/// another type (GeneralString, VideotexString, …), or bytes that do not
/// decode as their type.
fn directory_string(value: &[u8]) -> Result<String, String> {
    let tag = *value.first().ok_or("is empty")?;
    let named = string_type(tag);
    let (bytes, _) = element(value, tag).ok_or_else(|| format!("is malformed ({named})"))?;
    let bad = || format!("is not valid {named}");
    match tag {
        0x0c | 0x12 | 0x13 | 0x16 | 0x1a => String::from_utf8(bytes.to_vec()).map_err(|_| bad()),
        // A broker taking the CN as the login takes its bytes as they
        // are: only an ASCII TeletexString reads as the same text there.
        0x14 if bytes.is_ascii() => Ok(bytes.iter().map(|&b| char::from(b)).collect()),
        0x14 | 0x1e | 0x1c => Err(format!(
            "is a {named}{}: a broker taking the CN as the login (use_identity_as_username) takes its bytes as they are and would refuse the login: issue the certificate with its CN as a UTF8String or PrintableString",
            if tag == 0x14 { " with bytes past ASCII" } else { "" }
        )),
        _ => Err(format!(
            "is a {named}, a string type this does not read: issue the certificate with its CN as a UTF8String or PrintableString"
        )),
    }
}

/// The name of the ASN.1 string type of tag `tag`.
fn string_type(tag: u8) -> String {
    match tag {
        0x0c => "UTF8String".into(),
        0x12 => "NumericString".into(),
        0x13 => "PrintableString".into(),
        0x14 => "TeletexString".into(),
        0x15 => "VideotexString".into(),
        0x16 => "IA5String".into(),
        0x19 => "GraphicString".into(),
        0x1a => "VisibleString".into(),
        0x1b => "GeneralString".into(),
        0x1c => "UniversalString".into(),
        0x1e => "BMPString".into(),
        other => format!("value of tag 0x{other:02x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(dn: &[(rcgen::DnType, &str)]) -> rcgen::Certificate {
        let mut p = rcgen::CertificateParams::new(Vec::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap()
    }

    #[test]
    fn the_subjects_common_name_reads_back_or_none() {
        use rcgen::DnType::*;
        let c = cert(&[(OrganizationName, "Hall 1"), (CommonName, "h01")]);
        assert_eq!(common_name(c.der()).as_deref(), Ok("h01"));
        let c = cert(&[(CommonName, "cdu-1.b")]);
        assert_eq!(common_name(c.der()).as_deref(), Ok("cdu-1.b"));
        let c = cert(&[(OrganizationName, "Hall 1")]);
        let e = common_name(c.der()).unwrap_err();
        assert_eq!(e, "has no CN in its subject");
        let c = cert(&[(CommonName, "h01")]);
        let e = common_name(&c.der()[..30]).unwrap_err();
        assert_eq!(
            e, "is not a certificate whose subject can be read",
            "cut short"
        );
    }

    /// A CN as an older CA writes it reads as its text where its bytes are
    /// that text (an ASCII TeletexString); a BMPString or UniversalString,
    /// whose bytes a broker would take as the login, is refused naming its
    /// type, as is one of a string type not read, never as "no CN".
    #[test]
    fn a_cn_of_each_string_type_reads_or_its_type_is_named() {
        use rcgen::{BmpString, DnType::CommonName, DnValue, TeletexString, UniversalString};
        let of = |v: DnValue| {
            let mut p = rcgen::CertificateParams::new(Vec::new()).unwrap();
            p.distinguished_name = rcgen::DistinguishedName::new();
            p.distinguished_name.push(CommonName, v);
            let c = p.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
            common_name(c.der())
        };
        let teletex = TeletexString::try_from("h01").unwrap();
        assert_eq!(of(DnValue::TeletexString(teletex)).as_deref(), Ok("h01"));
        let bmp = BmpString::try_from("h01").unwrap();
        let e = of(DnValue::BmpString(bmp)).unwrap_err();
        assert!(
            e.starts_with("has a CN that is a BMPString: a broker"),
            "{e}"
        );
        let universal = UniversalString::try_from("h01").unwrap();
        let e = of(DnValue::UniversalString(universal)).unwrap_err();
        assert!(
            e.starts_with("has a CN that is a UniversalString: a broker"),
            "{e}"
        );
        // Teletex bytes past ASCII are refused too.
        let e = directory_string(&[0x14, 2, b'h', 0xe9]).unwrap_err();
        assert!(
            e.starts_with("is a TeletexString with bytes past ASCII"),
            "{e}"
        );
        // A GeneralString CN: the type is named. (The subject's, after
        // the issuer's of this self-signed certificate.)
        let c = cert(&[(CommonName, "h01")]);
        let mut der = c.der().to_vec();
        let at = der
            .windows(8)
            .rposition(|w| w == [0x55, 0x04, 0x03, 0x0c, 3, b'h', b'0', b'1'])
            .expect("the CN as a UTF8String");
        der[at + 3] = 0x1b;
        let e = common_name(&der).unwrap_err();
        assert!(
            e.starts_with("has a CN that is a GeneralString, a string type this does not read"),
            "{e}"
        );
    }
}
