package protocol

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// OperationID is the stable identity of one business side-effect intent
// (English seed section 8): tenant / run / step / effect version. It never
// contains a worker, an epoch, an attempt or a time, so a takeover or a
// restart derives the same id for the same intent (rule 5).
func OperationID(tenant, runID, step string, effectVersion int) string {
	return fmt.Sprintf("%s/%s/%s/v%d", tenant, runID, step, effectVersion)
}

// NewUUID is a random (version 4) UUID in its text form.
func NewUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Canonical is the canonical JSON text of v (English seed section 8: digests
// over explicit canonical serialisation): keys sorted, no whitespace, UTF-8
// unescaped, no HTML escaping; the same bytes the Python implementation and
// the mock tool produce, so digests compare across processes and languages.
// Numbers keep their text when v was decoded with UseNumber.
func Canonical(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, x[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		writeString(buf, x)
	default:
		var tmp bytes.Buffer
		enc := json.NewEncoder(&tmp)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(x); err != nil {
			return err
		}
		b := bytes.TrimRight(tmp.Bytes(), "\n")
		if len(b) > 0 && (b[0] == '{' || b[0] == '[') {
			// A struct or typed map/slice: normalise through a generic value.
			var g any
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			if err := d.Decode(&g); err != nil {
				return err
			}
			return writeCanonical(buf, g)
		}
		buf.Write(b)
	}
	return nil
}

// writeString escapes as Python's json.dumps(ensure_ascii=False) does.
func writeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(buf, `\u%04x`, r)
			} else {
				buf.WriteRune(r)
			}
		}
	}
	buf.WriteByte('"')
}

// Decode parses JSON keeping numbers as json.Number (their text survives).
func Decode(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// RequestDigest is the SHA-256 hex of the canonical JSON of a tool request.
func RequestDigest(v any) (string, error) {
	c, err := Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// StateHash is the SHA-256 of the canonical JSON of a checkpoint state.
func StateHash(canonical []byte) []byte {
	sum := sha256.Sum256(canonical)
	return sum[:]
}

// ValidUUID reports whether s is a UUID in text form.
func ValidUUID(s string) bool {
	if len(s) != 36 || strings.Count(s, "-") != 4 {
		return false
	}
	_, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	return err == nil
}
