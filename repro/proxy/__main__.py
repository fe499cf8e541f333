from repro.proxy.server import parse_args, serve

serve(parse_args())
