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

use super::validity::{element, names_and_validity};

/// The DER of the attribute type `commonName`, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The first CN of the subject of the certificate `der`; `None` where it
/// is not a certificate this reads, its subject has no CN, or the CN is
/// not a UTF8String, PrintableString or IA5String.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, _, subject) = names_and_validity(der)?;
    let mut sets = subject;
    while !sets.is_empty() {
        let (set, after) = element(sets, 0x31)?;
        sets = after;
        let mut attributes = set;
        while !attributes.is_empty() {
            let (attribute, after) = element(attributes, 0x30)?;
            attributes = after;
            let (oid, value) = element(attribute, 0x06)?;
            if oid != COMMON_NAME {
                continue;
            }
            // UTF8String, PrintableString, IA5String.
            let text = [0x0c, 0x13, 0x16]
                .into_iter()
                .find_map(|tag| element(value, tag))?
                .0;
            return String::from_utf8(text.to_vec()).ok();
        }
    }
    None
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
        assert_eq!(common_name(c.der()).as_deref(), Some("h01"));
        let c = cert(&[(CommonName, "cdu-1.b")]);
        assert_eq!(common_name(c.der()).as_deref(), Some("cdu-1.b"));
        let c = cert(&[(OrganizationName, "Hall 1")]);
        assert_eq!(common_name(c.der()), None, "no CN");
        let c = cert(&[(CommonName, "h01")]);
        assert_eq!(common_name(&c.der()[..30]), None, "cut short");
    }
}
