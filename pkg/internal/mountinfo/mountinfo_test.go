package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/plain`:         `/mnt/plain`,
		`/mnt/a\040b`:        `/mnt/a b`,
		`/mnt/tab\011x\134y`: "/mnt/tab\tx\\y",
		`/mnt/not\09escape`:  `/mnt/not\09escape`,
		`/mnt/short\04`:      `/mnt/short\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
