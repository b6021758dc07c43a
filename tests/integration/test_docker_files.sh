#!/usr/bin/env bash
# Static checks of the Docker files (no Docker engine needed; the
# federation itself runs in test_docker_compose.sh): the compose files
# parse; the build context, Dockerfile and every host path they name exist;
# every COPY source of the Dockerfile exists; the scripts are valid shell;
# and every option the compose commands pass exists in the executables' help.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
compose="$root/docker/docker-compose.yml"

perl -MYAML::XS -e '
    my $c = YAML::XS::LoadFile($ARGV[0]);
    my $dir = $ARGV[0]; $dir =~ s{/[^/]+$}{};
    my $s = $c->{services} or die "no services\n";
    for my $name ("coordinator", "client", "report") { $s->{$name} or die "service $name missing\n"; }
    for my $name (sort keys %$s) {
        my $svc = $s->{$name};
        if (my $b = $svc->{build}) {
            my $ctx = "$dir/$b->{context}";
            -d $ctx or die "$name: build context $ctx missing\n";
            -f "$ctx/$b->{dockerfile}" or die "$name: $b->{dockerfile} missing\n";
        }
        for my $v (@{ $svc->{volumes} || [] }) {
            my ($src) = split /:/, $v;
            next unless $src =~ m{^[./]};
            my $p = $src =~ m{^/} ? $src : "$dir/$src";
            -e $p or die "$name: volume source $p missing\n";
        }
        ref $svc->{command} eq "ARRAY" or die "$name: command must be a list\n";
        open my $out, ">", "$ENV{WORK}/$name.args" or die;
        print $out join("\n", @{ $svc->{command} }), "\n";
    }
    print "compose file parses: ", join(", ", sort keys %$s), "\n";
' "$compose" || fail "docker-compose.yml"

while read -r src; do
    [ -e "$root/$src" ] || fail "Dockerfile COPY source $src missing"
done < <(awk '$1 == "COPY" && $2 !~ /^--from/ { for (i = 2; i < NF; i++) print $i }' "$root/docker/Dockerfile")
perl -MYAML::XS -e 'YAML::XS::LoadFile($ARGV[0])->{services}{coordinator} or die' \
    "$root/docker/docker-compose.tls.yml" || fail "docker-compose.tls.yml"
for f in entrypoint.sh apt-need.sh; do
    sh -n "$root/docker/$f" || fail "$f is not valid shell"
    [ -x "$root/docker/$f" ] || fail "$f is not executable"
done
for f in base-image.sh make-certs.sh; do
    bash -n "$root/docker/$f" || fail "$f is not valid bash"
    [ -x "$root/docker/$f" ] || fail "$f is not executable"
done

check_options() { # args-file binary
    local help
    help=$("$2" --help 2>&1) || true
    grep -- '^--' "$1" | while read -r opt; do
        # A here-string, not a pipe: grep -q may exit before printf has
        # written everything, and pipefail would count printf's SIGPIPE.
        grep -q -- "$opt" <<<"$help" || fail "$(basename "$2") has no option $opt (docker-compose.yml)"
    done
}
check_options "$WORK/coordinator.args" "$BUILD/strata-server"
check_options "$WORK/client.args" "$BUILD/strata-client"
check_options "$WORK/report.args" "$BUILD/strata-sim"
echo "PASS: docker files"
